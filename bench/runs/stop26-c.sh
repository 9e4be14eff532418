#!/usr/bin/env bash
# Run C (stop 26): the streaming form served (test-ops over unix and tcp, five rounds of 1B
# Q4_0 tg128 local / unix / tcp) and tg128 of every benchmark model. Carry [".devbin"].
BIN=.devbin
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "tiny q8_0: $(tg $T 128)  tiny f16: $(tg $BIN/fx/tiny-llama-f16.gguf 128)"
echo "=== $(date -u +%T) served rounds"
DEVICE=CUDA0 OFF=0 CHECK=1 bash bench/serve-step.sh $F $Q 5 128 > $OUT/serve.log 2>&1
grep -E "median|ratio|passed" $OUT/serve.log | head -30
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 42, call J: the CUDA backend's structure key compared as it is walked (key_matches)
# instead of written whole and then compared (.dev6), against cc0e900's ferry (.dev4). Call
# A's graph stats (H100): the key took 11.3 us of a step's host time (F16; 8.8 Q4_0), while
# the GPU has nothing queued. Prediction (written before the run): key ~5 us, 1B Q4_0 tg128
# +0.5-1%, F16 +0.3-0.6%. First the graph-replay tests (the key decides every replay).
# Carry [".dev6", ".dev4"].
BIN=.dev6 source bench/runs/common.sh
gen_models
old_binary .dev4/ferry.xz
echo "=== $(date -u +%T) test_cuda"
tests "*Replayed*:*StagedInputs*:*InPlace*:*Alternating*:*SameLogits*:*LongDecode*:*EarlyAttention*:*Chunked*:*Fused*:*CudaOracle*:-*/f32" $(cap 150)
echo "=== $(date -u +%T) graph stats: new, then cc0e900"
for f in $F /tmp/ferry-old; do
  for m in $Q $H; do
    FERRY_CUDA_GRAPH_STATS=1 $f bench -m $m --device CUDA0 -p 0 -n 128 -r 3 2>&1 | grep -o "key [0-9.]* us each; .*replayed [0-9]*, [0-9.]* us each"
  done
done
echo "=== $(date -u +%T) tg128: new | cc0e900"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  echo "round $r: Q4_0 $(bt $Q --device CUDA0) | $(old $Q --device CUDA0)  F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

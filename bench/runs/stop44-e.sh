#!/usr/bin/env bash
# Stop 44, call E: the wo form's last block of a part read the heads' partials one L2 round
# trip a head (a running sum over a loop the compiler did not unroll: 32 round trips for 1B);
# now 16 heads' loads at once, added in the same order. Call D's trace: every form's
# attention+wo had a 6-9 us tail (median block end -> last block end) against 0.4-0.7 us for
# the plain attention. Prediction (before the run): the tail under 1.5 us, the attention+wo
# 6-8 us a layer against 5.1 + 7.2 separate, F16 tg128 +2-5% against separate for the best
# form. Carry [".dev13", ".devT13"].
BIN=.dev13 source bench/runs/common.sh
TRACE_BIN=.devT13
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
tests "*FoldedOutputProjection*" $(cap 60)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: separate | L0 | L1 | L2 | L0 T2 | L1 T2 | L2 T2; Q4_0"
for r in 1 2 3 4; do
  left 50 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 b $H) | $(b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H) | $(FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H)"
done
left 30 "timeline" && timeline L1
left 30 "timeline" && timeline L0 FERRY_CUDA_ATTN_WO_LOAD=0
echo "=== $(date -u +%T) done at ${SECONDS}s"

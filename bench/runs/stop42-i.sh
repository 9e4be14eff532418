#!/usr/bin/env bash
# Stop 42, call I: knobs whose best setting was measured with weights in the default L2 policy,
# again with them evict-first (cc0e900's ferry, .dev4), side by side: 1B Q4_0 with the bulk
# form (FERRY_CUDA_MV_BULK_Q=2, 3; its register form is the default) and without the early
# attention loads; 1B F16 without the early attention loads, with b read from global memory
# in every bulk launch (MV_BULK_XGLOBAL=1), and four slots a warp (MV_BULK=4).
# Prediction (written before the run): none beats the defaults by more than the spread, but
# ATTN_EARLY=0 comes closer than before (the cache's rows now hit L2).
# Carry [".dev4"].
BIN=.dev4 source bench/runs/common.sh
gen_models
q() { bt $Q --device CUDA0; }
h() { bt $H --device CUDA0; }
echo "=== $(date -u +%T) Q4_0 tg128: default | BULK_Q=2 | BULK_Q=3 | ATTN_EARLY=0"
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "round $r: $(q) | $(FERRY_CUDA_MV_BULK_Q=2 q) | $(FERRY_CUDA_MV_BULK_Q=3 q) | $(FERRY_CUDA_ATTN_EARLY=0 q)"
done
echo "=== $(date -u +%T) F16 tg128: default | ATTN_EARLY=0 | MV_BULK_XGLOBAL=1 | MV_BULK=4"
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "round $r: $(h) | $(FERRY_CUDA_ATTN_EARLY=0 h) | $(FERRY_CUDA_MV_BULK_XGLOBAL=1 h) | $(FERRY_CUDA_MV_BULK=4 h)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

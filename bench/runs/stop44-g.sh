#!/usr/bin/env bash
# Stop 44, call G: the wo form with gate/up's launch held to the grid's end
# (FERRY_CUDA_ATTN_WO_TRIGGER=3). Call F's per-block trace (H100, 1B F16, copies before the
# wait): every block had its scores by ~17.6 us and every non-last block ended at ~22.6,
# whenever its copies went out (some 13 us earlier); the four last blocks ended at ~27.4. The
# partials' stores, the fence and the last blocks' loads wait behind gate/up's first copies,
# launched at the attention's wait (one block an SM forced changed nothing: 938 t/s either way,
# separate 961). Prediction (before the run): with no early launch the form's tail falls to
# ~1-2 us and gate/up's prologue (~5 us) is exposed again: F16 within -1..+2% of separate.
# Carry [".dev15"].
BIN=.dev15 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: separate | L0 | L0 T3 | L1 T3 | L2 T3 | L0 T2"
for r in 1 2 3 4; do
  left 45 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=3 b $H) | $(FERRY_CUDA_ATTN_WO_TRIGGER=3 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_TRIGGER=3 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Stop 44, call J: the wo form (bench/runs/stop44-wo-fold.patch) with one fence a block
# (FERRY_CUDA_ATTN_WO_FENCE_ONE=1: a barrier, then thread 0's fence and count, as a grid
# barrier does) instead of a fence in each of the 256 threads, and each block's time once its
# partials are stored (TL_BLOCKS's "stored"). Call F: every non-last block ended ~5 us after
# its scores, all at the same time, whenever its copies had gone out. Prediction (before the
# run): if the 32K fences are what waits, "stored -> end" falls from ~4 us to <1 us and the
# fold gains 2-4 us a layer, F16 tg128 +1-3% against separate; if not, the stores themselves
# wait (the time to "stored" says which). Carry [".dev18", ".devT18"].
BIN=.dev18 source bench/runs/common.sh
TRACE_BIN=.devT18
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
b() { bt $1 --device CUDA0; }
export TL_BLOCKS=1
left 30 "timeline" && timeline L0 FERRY_CUDA_ATTN_WO_LOAD=0
grep -E "^      blk" $OUT/timeline-L0.txt | awk 'NR <= 6 || NR > 120'
grep -E "attn early\+wo" $OUT/timeline-L0.txt | tail -1
left 30 "timeline" && timeline L0F1 FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_FENCE_ONE=1
grep -E "^      blk" $OUT/timeline-L0F1.txt | awk 'NR <= 6 || NR > 120'
echo "=== $(date -u +%T) F16 tg128: separate | L0 | L0 F1 | L1 F1 | L2 F1"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_FENCE_ONE=1 b $H) | $(FERRY_CUDA_ATTN_WO_FENCE_ONE=1 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_FENCE_ONE=1 b $H)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

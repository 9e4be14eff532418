#!/usr/bin/env bash
# Stop 44, call F: why the wo form's blocks end up to 7 us after their median (call E's trace,
# every form): each block's start, wait, scores and end with its SM and part (TL_BLOCKS=1),
# and the form with one block an SM forced (FERRY_CUDA_ATTN_WO_SMEM=116: 116 KiB of shared
# memory a block; 109 KiB let two share an SM while others run none). Prediction (before the
# run): the late blocks are those sharing an SM; with one an SM the tail under 1.5 us and F16
# tg128 +2-5% against separate. Carry [".dev14", ".devT14"].
BIN=.dev14 source bench/runs/common.sh
TRACE_BIN=.devT14
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
b() { bt $1 --device CUDA0; }
export TL_BLOCKS=1
left 30 "timeline" && timeline L0 FERRY_CUDA_ATTN_WO_LOAD=0
grep -E "^      blk" $OUT/timeline-L0.txt | head -130
left 30 "timeline" && timeline L0S116 FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_SMEM=116
grep -E "^      blk" $OUT/timeline-L0S116.txt | awk 'NR <= 8 || NR > 120'
echo "=== $(date -u +%T) F16 tg128: separate | L0 | L0 S116 | L1 S116 | L2 S116 | L0 T2 S116"
for r in 1 2 3 4; do
  left 45 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_SMEM=116 b $H) | $(FERRY_CUDA_ATTN_WO_SMEM=116 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_SMEM=116 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=2 FERRY_CUDA_ATTN_WO_SMEM=116 b $H)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

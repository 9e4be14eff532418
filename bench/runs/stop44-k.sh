#!/usr/bin/env bash
# Stop 44, call K: when wo's rows land in the wo form's blocks ("tile": after the mbarrier
# wait, in the record's groups field), copies before the wait (L0) and after the scores (L2).
# Call J: 4.3 us from a block's scores to its partials stored, all blocks at the same time,
# and the last blocks 4.5 us more after their count; the fence ~1.2 us. Prediction (before
# the run): in L0 the rows land long before the scores, so the 4.3 us are not the copies.
# Carry [".dev18", ".devT19"].
BIN=.dev18 source bench/runs/common.sh
TRACE_BIN=.devT19
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
export TL_BLOCKS=1
left 30 "timeline" && timeline L0 FERRY_CUDA_ATTN_WO_LOAD=0
grep -E "^      blk" $OUT/timeline-L0.txt | awk 'NR <= 6 || NR > 122'
left 30 "timeline" && timeline L2 FERRY_CUDA_ATTN_WO_LOAD=2
grep -E "^      blk" $OUT/timeline-L2.txt | awk 'NR <= 6 || NR > 122'
echo "=== $(date -u +%T) done at ${SECONDS}s"

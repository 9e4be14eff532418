#!/usr/bin/env bash
# Stop 44, call D: where the wo form copies wo's rows (FERRY_CUDA_ATTN_WO_LOAD: 0 before the
# wait, 1 after it (default), 2 once the scores are summed) and where it lets gate/up launch
# (FERRY_CUDA_ATTN_WO_TRIGGER: 0 at the wait (default), 1 once wo's copies are out, 2 once the
# partials are written). Call C (H100): 1B F16 tg128 912-923 (after), 931-946 (before) against
# 962-969 separate; the trace: the attention's prologue 1.7 -> 6.5 us with wo's 64 KiB a block
# and gate/up's first copies (launched at its wait) both in flight behind its loads.
# Prediction (before the run): LOAD=2 keeps the prologue at ~1.7 us; with TRIGGER=2, gate/up's
# copies leave the attention alone: F16 within -1..+3% of separate.
# Carry [".dev12", ".devT12"].
BIN=.dev12 source bench/runs/common.sh
TRACE_BIN=.devT12
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
echo "=== $(date -u +%T) test_cuda"
tests "*FoldedOutputProjection*" $(cap 60)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: separate | L0 | L1 | L2 | L2 T1 | L2 T2 | L0 T2 | L1 T2"
for r in 1 2 3 4; do
  left 50 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 b $H) | $(b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_TRIGGER=1 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H) | $(FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H) | $(FERRY_CUDA_ATTN_WO_TRIGGER=2 b $H)"
done
left 30 "timeline" && timeline L2T2 FERRY_CUDA_ATTN_WO_LOAD=2 FERRY_CUDA_ATTN_WO_TRIGGER=2
left 30 "timeline" && timeline L0T2 FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_TRIGGER=2
echo "=== $(date -u +%T) done at ${SECONDS}s"

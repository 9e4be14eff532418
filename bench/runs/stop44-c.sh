#!/usr/bin/env bash
# Stop 44, call C: the wo form with wo's rows copied into shared memory by bulk copies (one
# per row, an mbarrier) instead of loaded into registers: after the attention's wait by
# default, before it with FERRY_CUDA_ATTN_WO_EARLY=1. Call B (H100): register loads after the
# wait took the attention+wo to 17.7 us a layer (its prologue 8 us: 64 KiB a block through
# the load units), F16 tg128 -7.5% against separate. Prediction (before the run): the copy
# engine streams 64 KiB a block within the attention's ~3.7 us after the wait, so F16 +2-5%
# against separate, the attention+wo 7-9 us a layer against 5.1 + 6.9.
# Carry [".dev11", ".devT11"].
BIN=.dev11 source bench/runs/common.sh
TRACE_BIN=.devT11
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
tests "*FoldedOutputProjection*:*EarlyAttention*" $(cap 100)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: F16 after | before the wait | separate | after + late trigger; BF16 after | separate"
for r in 1 2 3 4; do
  left 45 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_ATTN_WO_EARLY=1 b $H) | $(FERRY_CUDA_ATTN_WO=0 b $H) | $(FERRY_CUDA_ATTN_LATE_TRIGGER=1 b $H)  BF16 $(b $B) | $(FERRY_CUDA_ATTN_WO=0 b $B)"
done
left 30 "timeline" && timeline after
left 30 "timeline" && timeline separate FERRY_CUDA_ATTN_WO=0
echo "=== $(date -u +%T) done at ${SECONDS}s"

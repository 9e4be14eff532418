#!/usr/bin/env bash
# Stop 44, call B: the wo form with wo's rows loaded after the attention's wait (the default
# now; FERRY_CUDA_ATTN_WO_EARLY=1: before it, as in call A). Call A (H100): loaded before the
# wait, 1B F16 tg128 915-919 t/s against 960-973 separate (-5.5%); the trace put wo's 8.4 MB
# into q/k/v's window (q/k/v 8.7 -> 12.1 us a layer) and left the DRAM idle during the
# attention, where the separate wo's copies had gone; gate/up gained 2.7 us (launched at the
# attention's wait). Prediction (before the run): after the wait, F16 within -1..+3% of
# separate; the attention+wo's tail (8.2 us in call A) under 2 us.
# (.dev10: this build and fixtures; .devT10: its trace build.) Carry [".dev10", ".devT10"].
BIN=.dev10 source bench/runs/common.sh
TRACE_BIN=.devT10
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

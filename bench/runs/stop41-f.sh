#!/usr/bin/env bash
# Run F of stop 41: the bulk form's items past each warp's first S claimed from a counter
# (BulkWalk, FERRY_CUDA_MV_BULK_DYN). Run C's timelines (H100, 1B F16): gate/up's last block
# ends ~2.5 us after its median block, the output product's ~4.6 us after; the blocks started
# within ~0.6 us of each other and hold equal static shares, so the slowest SMs' share sets
# the end. With claims, the warps that get more of the memory take more of the last items.
# Prediction (written before the run): gate/up's tail (median end -> end) ~1 us, the output
# product's ~1.5 us; q/k/v, wo and down (about one item a warp) unchanged: 1B F16 tg128
# +1.5-2.5% over DYN=0.
#  1. test_cuda: the claims test (a generated model too) and the bulk/stream tests;
#  2. the trace build's timeline (.devT4), F16, claims on and off;
#  3. 1B F16 tg128 side by side; BF16 three rounds.
# Carry [".devK", ".devT4"].
BIN=${BIN:-.devK}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*Claimed*:*BulkStream*:*StreamProducts*}" $(cap 200)
TRACE_BIN=.devT4
timeline f16-dyn
timeline f16-static FERRY_CUDA_MV_BULK_DYN=0
wait
echo "=== $(date -u +%T) tg128 1B F16: claims | static"
for r in 1 2 3 4 5; do
  left 30 "F16 round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK_DYN=0 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) tg128 1B BF16: claims | static"
for r in 1 2 3; do
  left 30 "BF16 round $r" || break
  echo "round $r: $(bt /tmp/bf16.gguf --device CUDA0) | $(FERRY_CUDA_MV_BULK_DYN=0 bt /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

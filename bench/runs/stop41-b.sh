#!/usr/bin/env bash
# Run B of stop 41: three slots a warp in two bulk blocks per SM. Run A's timeline (1B F16,
# H100): gate/up's prologue (its RMS norm of b) takes ~4.9 us after its wait, the b reads
# queued behind the 16.9 MB its 264 blocks issued before it (2 slots of 4 KiB a warp); by the
# time the rows start, that much has landed and the refills start from an empty pipe.
# launch_bulk_t now shrinks S until a block takes at most half the SM for two blocks as it did
# for one, so FERRY_CUDA_MV_BULK=3 gives gate/up, q/k/v, wo and the output product 3 slots
# (two blocks of ~104 KiB) and down (b's 32 KiB) 2; until now S = 3 put down in one block per
# SM and was not measured with two (stop 34: 1B F16 S=3 one block 979-1,006 t/s, S=2 two
# blocks 1,127-1,172, H200). XGLOBAL=1 also gives down 3 (b from global memory).
# Prediction (written before the run): S = 3 keeps 25 MB in flight over gate/up's prologue,
# gate/up -1 to -2 us a layer, q/k/v ~-0.5: 1B F16 tg128 +2-3% on an H100; XGLOBAL=1 slower
# (down reads its 32 KiB b from L2 for every row, 28 KiB of L1).
#  1. test_cuda: the bulk and stream tests (f16, q4_0 fixtures in fx/);
#  2. the trace build's timeline (.devT2), F16, S = 2 / 3 / 3 with XGLOBAL;
#  3. 1B F16 tg128 side by side, alternating; BF16 two rounds.
# Carry [".devG", ".devT2"] (bash bench/build-for-device.sh .devG; the trace build into
# .devT2; ferry and test_cuda xz-compressed).
BIN=${BIN:-.devG}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*BulkStream*:*StreamProducts*}" $(cap 150)
TRACE_BIN=.devT2  # (timeline: common.sh)
timeline f16-s2
timeline f16-s3 FERRY_CUDA_MV_BULK=3
timeline f16-s3x FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_XGLOBAL=1
wait
echo "=== $(date -u +%T) tg128 1B F16: S=2 | S=3 | S=3 XGLOBAL"
for r in 1 2 3 4 5; do
  left 40 "F16 round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK=3 bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_XGLOBAL=1 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) tg128 1B BF16: S=2 | S=3"
for r in 1 2 3; do
  left 40 "BF16 round $r" || break
  echo "round $r: $(bt /tmp/bf16.gguf --device CUDA0) | $(FERRY_CUDA_MV_BULK=3 bt /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Prepared in stop 41, not run (no device time left): q/k/v's rope rotation asked for as an
# item starts (bench/runs/stop41-rope-early.patch: the bulk form's pair launches compute the
# rotation's position load and double-precision pow and sincos while the item's weights are
# summed, instead of after its sums; the same operations, so the same bits; only the four
# pair k_mv_bulk kernels' SASS changes). Stop 41's H200 timeline: q/k/v's rows take 4.0-4.5 us
# after its weights have landed, about one item a warp, against wo's 2.2.
# Prediction: q/k/v -0.5 to -1 us a layer, 1B F16 tg128 +1-1.5%.
# To run: git apply bench/runs/stop41-rope-early.patch; bash bench/build-for-device.sh .devN;
# xz .devN/ferry .devN/test_cuda; the tiny-llama f16, q4_0, reference.json and case*.logits.f32
# in .devN/fx; main's ferry.xz in .devM. Carry [".devN", ".devM"]. The run itself is run H's
# (the patched build against main's ferry, side by side, after the bulk-form tests).
BIN=${BIN:-.devN} FILTER=${FILTER:-*BulkStream*:*StreamProducts*:*FoldedNorm*:*FusedKernelsNever*} \
  exec bash "$(dirname "$0")/stop41-h.sh"

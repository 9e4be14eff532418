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
# in .devN/fx; main's ferry.xz in .devM. Carry [".devN", ".devM"].
BIN=${BIN:-.devN}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
xz -dc .devM/ferry.xz > /tmp/ferry-old && chmod +x /tmp/ferry-old
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*BulkStream*:*StreamProducts*:*FoldedNorm*:*FusedKernelsNever*}" $(cap 200)
wait
old() { F=/tmp/ferry-old bt "$@"; }
echo "=== $(date -u +%T) tg128 1B F16: patch | main; BF16: patch | main"
for r in 1 2 3 4 5; do
  left 30 "round $r" || break
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

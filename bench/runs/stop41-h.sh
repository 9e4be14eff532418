#!/usr/bin/env bash
# Run H of stop 41: the bulk form's plain launches (wo, down) ask for an item's residual as
# its first piece is summed instead of after its sum (one dependent round trip to L2 fewer at
# each item's end; these launches have about one item a warp, so that round trip sits at the
# end of the launch). Run G's H200 timeline: wo's rows 2.2-2.3 us with its weights already in
# shared memory.
# Prediction (written before the run): wo and down -0.3 to -0.8 us each a layer: 1B F16 tg128
# +1-2% against b2303d4's binary (.devM), side by side.
# Carry [".devL", ".devM"] (.devL: this build, tests and fixtures; .devM: b2303d4's ferry.xz).
# (stop41-i.sh runs it again for another patch: BIN, FILTER.)
BIN=${BIN:-.devL}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
old_binary .devM/ferry.xz
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*BulkStream*:*StreamProducts*:*WideStream*:*FoldedNorm*:*FusedKernelsNever*}" $(cap 200)
wait
echo "=== $(date -u +%T) tg128 1B F16: new | b2303d4; BF16: new | b2303d4"
for r in 1 2 3 4 5; do
  left 30 "round $r" || break
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

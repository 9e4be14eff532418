#!/usr/bin/env bash
# Run D of stop 41: the new defaults (S = 3 slots a warp for F16/BF16 bulk launches, two
# issued before griddepcontrol.wait where b is computed after it) against the old ones
# (FERRY_CUDA_MV_BULK=2 FERRY_CUDA_MV_BULK_PRE=0), side by side, then every test of test_cuda
# whose fixtures are here (all but the f32 file, which run E carries; and the 101 s ring-form
# test, whose kernels are unchanged) and `ferry test-ops --backend CUDA0`.
# Carry [".devI"] (ferry.xz, test_cuda.xz, fx.tar.xz: every tiny-llama fixture but f32).
BIN=${BIN:-.devI}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1
echo "=== $(date -u +%T) tg128 1B F16: new | old; BF16: new | old"
old() { FERRY_CUDA_MV_BULK=2 FERRY_CUDA_MV_BULK_PRE=0 bt "$@"; }
for r in 1 2 3 4; do
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 120 $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "rc $?"; grep -E "FAIL" $OUT/test-ops.txt | head; tail -1 $OUT/test-ops.txt
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*:-*RingProductsEqualTheRegisterForm*:*F32WithF32Cache*:*FusedDecodeMatchesUnfused*:*/f32}" $((LIMIT - SECONDS - 10))
echo "=== $(date -u +%T) done at ${SECONDS}s"

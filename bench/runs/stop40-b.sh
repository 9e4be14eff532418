#!/usr/bin/env bash
# Run B of stop 40: main after the chain's removal (k_mv_bulk now on the bulk form's functions:
# the SASS of stop 39's k_mv_bulk_fn, byte for byte; every other kernel's unchanged).
#  1. all of test_cuda but the 101 s ring-form test (its kernels unchanged), with every
#     tiny-llama fixture carried (fx.tar.xz: all but f32; fx2.tar.xz: f32), so that the oracle
#     cases stop 40's run 2 could not open (q4_1, q4_k_m, q6_k) run;
#  2. `ferry test-ops --backend CUDA0`;
#  3. 1B F16 and Q4_0 tg128, three repetitions each;
#  4. served side by side (local | unix | tcp) when time is left.
# Carry [".devB"] (bash bench/build-for-device.sh; xz ferry and test_cuda; the fixtures).
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*:-*RingProductsEqualTheRegisterForm*}" $(cap 300)
wait
echo "=== $(date -u +%T) test-ops CUDA0"
timeout $(cap 120) $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "rc $?"; grep -E "FAIL" $OUT/test-ops.txt | head; tail -1 $OUT/test-ops.txt
echo "=== $(date -u +%T) tg128: F16 | Q4_0"
for r in 1 2 3; do echo "round $r: $(bt $H --device CUDA0) | $(bt $Q --device CUDA0)"; done
left 120 "served" || exit 0
echo "=== $(date -u +%T) served"
served_side_by_side
echo "=== $(date -u +%T) done at ${SECONDS}s"

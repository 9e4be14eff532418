#!/usr/bin/env bash
# Stop 42, call D: the evict-first weights (.dev3: main with L2::evict_first on the products'
# weight reads, by default) through `ferry test-ops --backend CUDA0` and test_cuda: every test
# whose fixtures are here (all but the f32 file), the 101 s ring-form and 147 s
# progressive-results tests last, as time allows. The hints change no value: the products'
# bits tests must pass and the oracle cases give stop 41's figures.
# Carry [".dev3"] (ferry.xz, test_cuda.xz, fx.tar.xz: every tiny-llama fixture but f32).
BIN=.dev3 source bench/runs/common.sh
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 120 $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "rc $?"; grep -E "FAIL" $OUT/test-ops.txt | head; tail -1 $OUT/test-ops.txt
echo "=== $(date -u +%T) test_cuda"
tests "*:-*RingProductsEqualTheRegisterForm*:*ProgressiveResults*:*F32WithF32Cache*:*/f32" $(cap 330)
grep -hE "KL|nmse|top-1" $OUT/test_cuda.*.txt | head -30
left 120 "ring form" && tests "*RingProductsEqualTheRegisterForm*" $(cap 150)
left 160 "progressive" && tests "*ProgressiveResults*" $(cap 200)
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Stop 43, call D: main with the L2 ask on by default (d641b72): every test of test_cuda whose
# fixtures fit the carry (all but the f32 file: F32WithF32Cache, FusedDecodeMatchesUnfused,
# the f32 oracle case; and the 101 s ring-form test, whose kernels are unchanged),
# `ferry test-ops --backend CUDA0`, `ferry bench -p 512 -n 128 -r 5` of the 1B F16, BF16,
# Q4_0 files and tiny-llama Q8_0, and the served ratios (local | unix | tcp).
# Carry [".dev4"] (ferry.xz, test_cuda.xz, fx.tar.xz: every tiny-llama fixture but f32).
BIN=.dev4 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 120 $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "rc $?"; grep -E "FAIL" $OUT/test-ops.txt | head; tail -1 $OUT/test-ops.txt
echo "=== $(date -u +%T) test_cuda"
tests "*:-*RingProductsEqualTheRegisterForm*:*F32WithF32Cache*:*FusedDecodeMatchesUnfused*:*/f32" $(cap 240)
echo "=== $(date -u +%T) bench"
for m in $H /tmp/bf16.gguf $Q $T; do
  left 25 "bench $m" && $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"
done
echo "=== $(date -u +%T) served"
left 120 "served" && served_side_by_side
echo "=== $(date -u +%T) done at ${SECONDS}s"

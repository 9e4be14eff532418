#!/usr/bin/env bash
# Stop 44, call H: main (ad5e6f9, the wo form reverted) on a GPU for the first time since
# 2b5a294 (the L2 ask on by default only below 4 TB/s; `ferry devices` names the peak),
# 5eb6b77 and ad5e6f9 (test_cuda's CPU share on the host's cores): `ferry devices`,
# `ferry test-ops --backend CUDA0`, every test_cuda test whose fixtures fit the carry (all but
# the q4_1 and q5_k_m cases) but the ring-form test, each test's time, and the tg128 of the
# 1B F16 and Q4_0 files. Carry [".dev16"] (ferry.xz, test_cuda.xz, fx.tar.xz).
BIN=.dev16 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
$F devices 2>&1 | head -4
gen_models &
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 120 $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "rc $?"; grep -E "FAIL" $OUT/test-ops.txt | head; tail -1 $OUT/test-ops.txt
wait
echo "=== $(date -u +%T) test_cuda"
tests "*:-*RingProductsEqualTheRegisterForm*:*/q4_1:*Q5KM*:*KQuantLogits*" $(cap 420)
grep -E "^\[       OK \]" $OUT/test_cuda.stop44-h.1.txt | sort -t'(' -k2 -n -r | head -8
left 40 "bench" && for m in $H $Q; do $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"; done
echo "=== $(date -u +%T) done at ${SECONDS}s"

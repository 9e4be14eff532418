#!/usr/bin/env bash
# Run A (stop 27): every test_cuda test on b0d093e (the review refactor of stop 26: dot8,
# Dec<T>::from_raw in the streaming form, rope_pair, kQ8MaxK), which no GPU had run, with the
# tiny-llama fixtures but q4_1, q5_k_m and q6_k carried (the 64 MiB carry, with run B's
# binary); then test-ops and tg128 as a check of the figures.
# .devF holds ferry.xz, test_cuda.xz and fx/; carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test but the q4_1, q5_k_m and q6_k oracle cases (fixtures not carried)"
timeout 300 $TC --gtest_filter='-*q4_1*:*q5_k_m*:*q6_k*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 100 $F test-ops --backend CUDA0 > $OUT/ops.txt 2>&1; grep -E "FAIL" $OUT/ops.txt | head; tail -1 $OUT/ops.txt
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run F (stop 27): the streaming form's kernels ask for the dynamic shared memory of
# kStreamMaxK (F16/BF16 rows of 12288: b's 48 KiB plus the kernel's static shared memory
# failed to launch, found by run E); StreamProducts now has K = 12288. Then tg128 as a check.
# Carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: stream products, fused decode, same logits"
timeout 150 $TC --gtest_filter='*StreamProducts*:*FusedDecode*:*SameLogits*:*ModelShaped*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|OK \]" $OUT/test_cuda.txt | head -30
wait
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "=== $(date -u +%T) done"

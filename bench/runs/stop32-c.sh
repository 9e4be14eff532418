#!/usr/bin/env bash
# Run C (stop 32): interleaved stripes. Run B's traces showed stripe 0 (the first half of the
# logits) sent as the last piece came, and the lane's stripe (the second half) 30-45 us later:
# contiguous stripes leave the second connection idle while the first half is made and alone
# with a half while the second is. Now chunks of 32 KiB alternate between stripes. Prediction:
# the lanes finish within ~10 us of the last piece; tcp >= 0.94 of local with the flagged
# mirror. The served tests, then run B's commands.
# .devC holds ferry.xz and test_cuda.xz; carry [".devC"].
BIN=${BIN:-.devC}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: progressive, served"
FERRY_TEST_BIN=$F timeout 300 $TC --gtest_filter="${FILTER:-*Progressive*:*Served*}" > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|op cases" $OUT/test_cuda.txt | head -30
grep -B2 -A12 "Failure" $OUT/test_cuda.txt | head -40
wait
BIN=$BIN bash bench/runs/stop32-b.sh 2>&1 | sed -e '/progressive replies/s/^ferry serve: //'

#!/usr/bin/env bash
# Run J (stop 30): review refactor, the server's striped and progressive replies in one
# function (Stream::reply_in_order): the served tcp test (pieces 8, 0, 2, 16, one connection),
# test-ops over tcp, and the served step (two rounds, local | unix | tcp).
# .devJ holds ferry.xz and test_cuda.xz; carry [".devJ"].
BIN=.devJ
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*ServedTcp*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda.txt | head -20
wait
echo "=== $(date -u +%T) served"
CHECK=1 OFF=0 DEVICE=CUDA0 bash bench/serve-step.sh $F $Q 2 128 2>&1 | tail -8
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run H (stop 30): the progressive product capped at 16M rows and its pinned copy reported as
# the backend's scratch_bytes (charged by the server): the progressive tests, then the served
# step (two rounds, local | unix | tcp).
# .devH holds ferry.xz and test_cuda.xz; carry [".devH"].
BIN=.devH
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*ServedTcp*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda.txt | head -20
wait
echo "=== $(date -u +%T) served"
OFF=0 DEVICE=CUDA0 bash bench/serve-step.sh $F $Q 2 128 2>&1 | tail -6
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 43, call E: the tests call D's 240 s did not reach. Call D's run was still in
# ProgressiveResultsGiveTheUsualBytes after ~115 s (it passed in stop 41's calls 4-5): alone,
# with the L2 ask (default) and without it (FERRY_CUDA_L2_NEXT=0), then the rest but the f32
# file's. Carry [".dev4"].
BIN=.dev4 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== $(date -u +%T) progressive, default"
tests "*ProgressiveResults*" 150
if [ $TESTS_RC -ne 0 ]; then
  echo "=== $(date -u +%T) progressive, FERRY_CUDA_L2_NEXT=0"
  FERRY_CUDA_L2_NEXT=0 tests "*ProgressiveResults*" 150
fi
echo "=== $(date -u +%T) the rest"
tests "*ServedTcp*:*EventsAndPinned*:*TooLarge*:*CudaOracle*:*Copies*:*ModelSplit*:-*/f32" $(cap 200)
echo "=== $(date -u +%T) done at ${SECONDS}s"

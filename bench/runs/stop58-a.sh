#!/usr/bin/env bash
# Stop 58, call A (any card), binaries of main at 15633df (.dev58: ferry.xz, test_cuda.xz,
# fx.tar.xz; carry [".dev58"]). On an H200: stop 57's call A, which has not run on one (the F16
# target first: 1B F16 tg128 plan | default, prediction ~1,335; the copies-in-flight sweep; bench
# tables with memory and bandwidth; served rounds; then the whole of test_cuda and test-ops).
# On an H100: the whole of test_cuda and test-ops first (6780e3a, the frame loop's one read of
# "has another request arrived", has not run on a GPU: Cuda.ServedStepsQueuedAheadGiveTheSameBits
# counts the server's early queues), then stop 57's call B (the tcp slow start's traces).
export BIN=.dev58
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if [[ $CARD == *H200* ]]; then
  exec bash bench/runs/stop57-a.sh
fi
source bench/runs/common.sh
echo "$CARD"
tests "*" $(cap 200)
left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 1; }
date +%T
LIMIT=$((LIMIT - SECONDS)) bash bench/runs/stop57-b.sh

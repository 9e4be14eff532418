#!/usr/bin/env bash
# Stop 43, call I: ProgressiveResultsGiveTheUsualBytes with each type's weights made once
# instead of per case (132 s in call H, most of it quantizing 82M values on the CPU, 22 times).
# Prediction: under 40 s, passing. Carry [".dev8"].
BIN=.dev8 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*ProgressiveResults*" $(cap 150)
grep "ProgressiveResults" $OUT/test_cuda.*.txt | tail -1
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Run I (stop 27): run B's timeline again on the final kernels (Q4_0/Q6_K wo and down in one
# 16-warp block per SM) from a FERRY_CUDA_TRACE build (CUDA_FLAGS=-DFERRY_CUDA_TRACE
# BUILD_DIR=build/devtrace bash bench/build-for-device.sh DIR; carry [".devT"], ferry.xz only).
BIN=.devT
source bench/runs/common.sh
gen_models
for m in $Q $H; do
  b=$(basename $m .gguf)
  echo "=== $(date -u +%T) trace $b"
  FERRY_CUDA_TRACE_OUT=$OUT/trace-$b.bin $F bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
  python3 bench/tools/trace-timeline.py $OUT/trace-$b.bin > $OUT/timeline-$b.txt 2>&1
  rm -f $OUT/trace-$b.bin
  grep -A8 "^per kind" $OUT/timeline-$b.txt; grep "^step" $OUT/timeline-$b.txt
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run B (stop 27): the timeline of a decode step's products with the streaming form, from a
# FERRY_CUDA_TRACE build (CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace
# bash bench/build-for-device.sh .devT): per block its start, the end of griddepcontrol.wait,
# b in shared memory and its end (bench/tools/trace-timeline.py). 1B F16 and Q4_0, tg64.
# Carry [".devT"] (ferry.xz only).
BIN=.devT
source bench/runs/common.sh
gen_models
for m in $H $Q; do
  b=$(basename $m .gguf)
  echo "=== $(date -u +%T) trace $b"
  FERRY_CUDA_TRACE_OUT=$OUT/trace-$b.bin $F bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
  python3 bench/tools/trace-timeline.py $OUT/trace-$b.bin > $OUT/timeline-$b.txt 2>&1
  tail -12 $OUT/timeline-$b.txt
  sed -n 1,30p $OUT/timeline-$b.txt
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run C for a session with a GPU (prepared in stop 36, not yet run), if stop36-b's chain
# figures disappoint: where a chained layer's time goes. A FERRY_CUDA_TRACE build
# (CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace bash bench/build-for-device.sh .devT;
# then xz -T2 -6 .devT/ferry and rm .devT/test_cuda) records every block of every product, a
# chain's stages each as a launch of its own ("chain" in bench/tools/trace-timeline.py):
# start, the barrier (or griddepcontrol.wait) passed, b in shared memory, end. 1B F16 and
# Q4_0, tg64, chain off and on. Carry [".devT"].
BIN=${BIN:-.devT}
source bench/runs/common.sh
gen_models
for m in $H $Q; do
  b=$(basename $m .gguf)
  for c in 0 1; do
    echo "=== $(date -u +%T) trace $b chain=$c"
    FERRY_CUDA_CHAIN=$c FERRY_CUDA_TRACE_OUT=$OUT/trace-$b-$c.bin \
      $F bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
    python3 bench/tools/trace-timeline.py $OUT/trace-$b-$c.bin > $OUT/timeline-$b-$c.txt 2>&1
    tail -12 $OUT/timeline-$b-$c.txt
  done
done
echo "=== $(date -u +%T) done"

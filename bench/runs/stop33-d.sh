#!/usr/bin/env bash
# (stop33-bulk.patch landed in stop 35, commit e1936d9: the bulk form is main's, on by default for
# F16/BF16. The patch itself: `git show ed37fd5:bench/runs/stop33-bulk.patch`.)
# Run D (stop 33, prepared; not yet run): the per-kernel timeline of 1B F16 (and Q4_0) decode,
# register form against the bulk form, from a FERRY_CUDA_TRACE build of main + the bulk patch:
#   git apply bench/runs/stop33-bulk.patch (on a scratch branch), then
#   CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace bash bench/build-for-device.sh /tmp/devT
#   mkdir -p .devT && xz -c /tmp/devT/ferry > .devT/ferry.xz   (and move .devA out of the tree:
#   the working tree travels whole, and both do not fit 64 MiB)
# carry [".devT"]. What to read: whether the bulk kernels' blocks start (t0) before the kernel
# before them ends, their wait (t1 - t0) and prologue, and the attention's gap (stop 29's
# "wait" and "prologue" columns). BULK / BULK_Q: the forms to trace (default S = 3 and 8).
BIN=${BIN:-.devT}
source bench/runs/common.sh
gen_models
for m in $H $Q; do
  b=$(basename $m .gguf)
  for form in register "FERRY_CUDA_MV_BULK=${BULK:-3} FERRY_CUDA_MV_BULK_Q=${BULK_Q:-8}"; do
    envs=()
    [ "$form" != register ] && read -r -a envs <<< "$form"
    echo "=== $(date -u +%T) trace $b, $form"
    env "${envs[@]}" FERRY_CUDA_TRACE_OUT=$OUT/trace.bin $F bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 |
      grep tg64
    python3 bench/tools/trace-timeline.py $OUT/trace.bin > "$OUT/timeline-$b-${form%% *}.txt" 2>&1
    rm -f $OUT/trace.bin
    grep -A8 "^per kind" "$OUT/timeline-$b-${form%% *}.txt"
    grep "^step" "$OUT/timeline-$b-${form%% *}.txt"
  done
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 54, call A: the persistent step's attention with a head's keys split over four blocks
# (merged by wo's input read), every key and value of up to 1,024 loaded before its wait.
# Stop 54's first calls (H100, wip53-values): with one block a head, tg512 0.984 -> 1.05 of
# the plan's, but tg1024 still 0.98 (its last 256 tokens ~15% slower than the plan's).
# The two persistent tests (split and one block a head against the plan, up to 1,024 keys),
# then 1B F16 tg128 / tg512 / tg1024: the plan (FERRY_CUDA_PERSIST=0) | every graph, split
# (=1) | every graph, one block a head (=1, FERRY_CUDA_PERSIST_SPLITS=1).
# Prediction: tg128 split within 0.5% of one block a head; tg512 +2-4% and tg1024 +8-12% over
# one block a head, both above the plan's.
# Then tg128 with the logits copied or stored by the step (prediction: +1.0-1.5%, the ~9 us
# copy of 513 KB a token), tg128 by the producer's copies in flight (FERRY_CUDA_PERSIST_INFLIGHT), and ncu's
# durations of the step's kernels.
# .dev54: ferry.xz, test_cuda.xz (bench/build-for-device.sh). Carry [".dev54"].
BIN=${BIN:-.dev54} source bench/runs/common.sh
persist_tests 'Cuda.PersistentDecode*' 150
S=(FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_SPLITS=0) O=(FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_SPLITS=1)
echo "--- tg128: plan | split | a block a head"
for r in 1 2; do echo "$(R=5 tg $H 128 FERRY_CUDA_PERSIST=0) | $(R=5 tg $H 128 ${S[@]}) | $(R=5 tg $H 128 ${O[@]})"; done
for n in 512 1024; do
  echo "--- tg$n: plan | split | a block a head"
  for r in 1 2; do left 45 "tg$n round $r" && echo "$(R=2 tg $H $n FERRY_CUDA_PERSIST=0) | $(R=2 tg $H $n ${S[@]}) | $(R=2 tg $H $n ${O[@]})"; done
done
# The persistent step's logits stored into the session's read memory by the step queued ahead
# (no device-to-host copy after it) against the copy (FERRY_CUDA_HOST_READ=0), tg128, split.
echo "--- tg128 host read: copy | stored by the step"
for r in 1 2 3; do left 30 "host read round $r" && echo "$(R=5 tg $H 128 ${S[@]} FERRY_CUDA_HOST_READ=0) | $(R=5 tg $H 128 ${S[@]})"; done
# The producer's copies in flight (elsewhere, in the attention's chain), split attention, tg128:
# stop 51 measured the prototype's on an H200 with strided tiles only.
ti() { R=3 tg $H 128 ${S[@]} FERRY_CUDA_PERSIST_INFLIGHT=$1; }
echo "--- tg128 by copies in flight: 3,1 | 3,2 | 2,1 | 4,1 | 4,2 | 3,3 | 5,1"
for r in 1 2; do left 50 "in flight round $r" && echo "$(ti 3,1) | $(ti 3,2) | $(ti 2,1) | $(ti 4,1) | $(ti 4,2) | $(ti 3,3) | $(ti 5,1)"; done
# The step's kernels' own durations (ncu, clocks left alone) against the step's period: what
# lies between two persistent launches.
if left 60 "ncu"; then
  timeout $(cap 60) ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 300 \
    --launch-count 16 $F bench -m $H --device CUDA0 -p 0 -n 256 -r 1 2>&1 |
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" | head -40
fi
date +%T

#!/usr/bin/env bash
# Run B (stop 31): where run A's host-mirror cost (1B Q4_0 tg128 1,770 -> 370 t/s with nobody
# reading) comes from: a build with FERRY_CUDA_MIRROR_SKIP bits (1: the run number passed as a
# kernel argument instead of read from host memory by every thread; 2: no fill of the other
# half; 4: no row stores; 8: the run number read by lane 0 only; 16: weak stores instead of
# st.relaxed.sys). Local, nobody reading, pieces forced (FERRY_CUDA_PIECES=8).
# .devB holds ferry.xz; carry [".devB"].
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devB
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) none | skip 0 | 8 | 1 | 3 | 5 | 7 | 17"
for m in $Q; do
  line="$(R=3 tg $m 128)"
  for k in 0 8 1 3 5 7 17; do line="$line | $k: $(R=3 tg $m 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_MIRROR_SKIP=$k)"; done
  echo "$line"
done
echo "=== $(date -u +%T) done"

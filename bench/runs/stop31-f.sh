#!/usr/bin/env bash
# Run F (stop 31): whether run E's served loss is the reader polling the lines the GPU writes:
# run E's build with FERRY_CUDA_MIRROR_POLL_NS=N (the reader waits N ns between scans without
# touching the mirror). Served 1B Q4_0, mirror servers (polling every 2 us, then 5 us, then
# every turn as in run E) against cut servers (FERRY_CUDA_PIECE_CUT=1), four rounds each.
# .devF holds ferry.xz; carry [".devF"].
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devF
source bench/runs/common.sh
gen_models
for ns in 2000 5000 0; do
  echo "=== $(date -u +%T) mirror polling every $ns ns | cut"
  FERRY_CUDA_MIRROR_POLL_NS=$ns SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" OFF=1 DEVICE=CUDA0 \
    bash bench/serve-step.sh $F $Q 4 128 2>&1 | grep -E "t/s:|/ local"
done
echo "=== $(date -u +%T) done"

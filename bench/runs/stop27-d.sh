#!/usr/bin/env bash
# (The L2 prefetch and FERRY_SOCKET_BUF switches were removed after this run: both lost; see
# bench/results/cuda.md, stop 27.)
# Run D (stop 27): served 1B Q4_0 tg128, the default servers against servers that spin (300 us
# before a receive blocks, and now through a full send buffer: FERRY_SOCKET_SPIN_US=300), then
# against fixed 8 MiB socket buffers on both ends of tcp (FERRY_SOCKET_BUF). Carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) served: local | unix | unix, server spins | tcp | tcp, server spins"
DEVICE=CUDA0 SERVER_AB=1 SERVER_ENV="FERRY_SOCKET_SPIN_US=300" bash bench/serve-step.sh $F $Q 4 128 > $OUT/serve-spin.log 2>&1
grep -E "median|ratio" $OUT/serve-spin.log | head -20
echo "=== $(date -u +%T) served: local | unix | unix, 8 MiB buffers | tcp | tcp, 8 MiB buffers"
DEVICE=CUDA0 SERVER_AB=1 SERVER_ENV="FERRY_SOCKET_BUF=8388608" CLIENT_ENV="FERRY_SOCKET_BUF=8388608" bash bench/serve-step.sh $F $Q 3 128 > $OUT/serve-buf.log 2>&1
grep -E "median|ratio" $OUT/serve-buf.log | head -20
echo "=== $(date -u +%T) done"

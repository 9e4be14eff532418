#!/usr/bin/env bash
# Run B of stop 38, the follow-up to stop37-a.sh when the chain (FERRY_CUDA_CHAIN=1) wins or
# ties there: the whole of test_cuda with the chain on (every oracle case, the fused-decode and
# served tests, the op suite), then decode through `ferry serve` with the chain on in the
# server and the local run: 1B Q4_0 (3 rounds) and F16 (2 rounds), local | unix | tcp.
# CHAIN=0 runs the same with the chain off (the baseline, when the call has time for both).
# What it must show before the chain becomes the default: every test as without it, and the
# served ratios (unix >= 0.97, tcp >= 0.95 of local) no worse than stop 35's (0.97 / 0.95).
# Carry [".devB"]; files: log.txt (tee the output) and test_cuda.stop38-b.1.txt.
BIN=${BIN:-.devB}
source bench/runs/common.sh
export FERRY_CUDA_CHAIN=${CHAIN:-1}
gen_models &
echo "=== $(date -u +%T) test_cuda, FERRY_CUDA_CHAIN=$FERRY_CUDA_CHAIN"
# (RingProductsEqualTheRegisterForm, 101 s on stop 39's H100, checks the int8 kernel's ring
# form with the streaming form off, which no chain takes: left out unless FILTER says.)
tests "${FILTER:-*:-*RingProductsEqualTheRegisterForm*}" $(cap 330)
wait
left 150 "served" || exit 0
echo "=== $(date -u +%T) served, FERRY_CUDA_CHAIN=$FERRY_CUDA_CHAIN"
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
side_by_side "tcp" "0" "0"
echo "=== $(date -u +%T) done at ${SECONDS}s"

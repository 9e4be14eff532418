#!/usr/bin/env bash
# Run B of stop 37: stop37-a cut to what a call of ~4 minutes holds, for a session whose device
# time ran low waiting for a machine: the chain's tests, then 1B F16 tg128 default | CHAIN=1 |
# CHAIN=1 COOP=0 and 1B Q4_0 default | CHAIN=1, side by side, while LIMIT (s) allows.
# Carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
LIMIT=${LIMIT:-230}
gen_models &
echo "=== $(date -u +%T) test_cuda: chain"
tests "*ChainedProducts*:*BulkStream*" 75
wait
echo "=== $(date -u +%T) 1B F16 tg128: default | CHAIN=1 | CHAIN=1 COOP=0; Q4_0 default | CHAIN=1"
for r in 1 2 3; do
  [ $((SECONDS + 40)) -lt $LIMIT ] || break
  echo "F16 round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_CHAIN=1 bt $H --device CUDA0) | $(FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_COOP=0 bt $H --device CUDA0)"
  [ $((SECONDS + 25)) -lt $LIMIT ] || break
  echo "Q4_0 round $r: $(bt $Q --device CUDA0) | $(FERRY_CUDA_CHAIN=1 bt $Q --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

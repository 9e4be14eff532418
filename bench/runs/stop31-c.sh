#!/usr/bin/env bash
# Run C (stop 31): the host mirror in groups (each warp stores 8 of its rows as one 32-byte
# write, and empties the same slots of the other half; the run's half from a parity in device
# memory that the last block flips): the progressive, served and product tests; what the
# mirror and the cut form cost the GPU with nobody reading; served side by side (tcp: mirror
# servers against cut servers). Prediction: the mirror costs the GPU <= 1% (the cut form ~5%),
# tcp >= 0.93 of local.
# .devC holds ferry.xz and test_cuda.xz; carry [".devC"]. Runs D and E ran the same with
# BIN=.devD / .devE and FILTER='*Progressive*:*Served*'.
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=${BIN:-.devC}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: progressive, served, products"
FERRY_TEST_BIN=$F timeout 300 $TC --gtest_filter="${FILTER:-*Progressive*:*Served*:*Product*:*Stream*:*Ring*:*FoldedNorm*:*EveryOp*}" > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|op cases" $OUT/test_cuda.txt | head -30
grep -B2 -A12 "Failure" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) local, nobody reading: none | mirror | cut (8)"
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_CUT=1)"
done
echo "f16:  $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_CUT=1)"
echo "=== $(date -u +%T) served: local | unix | unix (cut servers) | tcp mirror | tcp cut"
SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | tail -14
echo "=== $(date -u +%T) served F16, two rounds"
SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $H 2 128 2>&1 | grep -E "/ local"
echo "=== $(date -u +%T) done"

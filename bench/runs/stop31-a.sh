#!/usr/bin/env bash
# Run A (stop 31): the host mirror (the progressive product's kernel stores each row into
# host-mapped memory as it sums it; the reader hands out what is there) against stop 30's cut
# form (FERRY_CUDA_PIECE_CUT=1: 8 launches, copies and flags on a second stream). Every
# test_cuda test with every fixture; what each form costs the GPU with nobody reading (local
# backends forced to make them); served side by side (tcp: mirror servers against cut servers).
# .devA holds ferry.xz, test_cuda.xz and fx.tar.xz; carry [".devA"].
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devA
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
FERRY_TEST_BIN=$F timeout 300 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|\[ cuda.*(oracle|nmse|KL|early|op cases)" $OUT/test_cuda.txt | head -60
grep -B2 -A12 "Failure" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) local, nobody reading: none | mirror | cut (8)"
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_CUT=1)"
done
echo "f16:  $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_CUT=1)"
echo "=== $(date -u +%T) served: local | unix | unix (cut servers) | tcp mirror | tcp cut"
CHECK=1 SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | tail -16
echo "=== $(date -u +%T) done"

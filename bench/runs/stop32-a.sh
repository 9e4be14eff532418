#!/usr/bin/env bash
# Run A (stop 32): the flagged mirror. Stop 31's mirror (the product's kernel storing its rows
# into host-mapped memory) cost the GPU ~1.5% but lost to the cut form served over tcp,
# likely because its reader scanned every word for a sentinel on the thread that also sends.
# Here each warp fences at system scope after a run's line and counts itself into its step;
# the warp completing a step sets the step's host flag, and the reader polls 8 flags (no scan,
# no sentinel, one buffer). Prediction: GPU cost ~1-2% (17K system fences a step, spread over
# the warps), tcp above the cut form's (>= 0.93 of local).
# .devA holds ferry.xz and test_cuda.xz; carry [".devA"].
BIN=${BIN:-.devA}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: progressive, served"
FERRY_TEST_BIN=$F timeout 300 $TC --gtest_filter="${FILTER:-*Progressive*:*Served*}" > $OUT/test_cuda.txt 2>&1
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
  bash bench/serve-step.sh $F $Q 5 128 2>&1 | tail -14
echo "=== $(date -u +%T) served F16, two rounds"
SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $H 2 128 2>&1 | grep -E "/ local"
echo "=== $(date -u +%T) done"

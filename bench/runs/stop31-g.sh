#!/usr/bin/env bash
# Run G (stop 31): run E's mirror with runs of 8 rows (32-byte writes: ~13 us a step in run C,
# but the rows come in steps of W x 8 rows, 8 for the 1B vocabulary, as the cut form's 8
# pieces do, instead of 4); every test_cuda test with every fixture; what the mirror and the
# cut form cost the GPU with nobody reading; served side by side (mirror servers against cut
# servers). Prediction: GPU cost ~1%, tcp above the cut form's.
# .devG holds ferry.xz, test_cuda.xz and fx.tar.xz; carry [".devG"].
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devG
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
FERRY_TEST_BIN=$F timeout 330 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|PASSED|tests ran|SKIPPED|op cases" $OUT/test_cuda.txt | head -20
wait
echo "=== $(date -u +%T) local, nobody reading: none | mirror | cut (8)"
echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_CUT=1)"
echo "=== $(date -u +%T) served: local | unix | unix (cut servers) | tcp mirror | tcp cut"
SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | grep -E "t/s:|/ local"
echo "=== $(date -u +%T) done"

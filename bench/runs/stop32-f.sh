#!/usr/bin/env bash
# Run F (stop 32): the final candidate's binaries (flagged mirror, interleaved stripes, the
# servers' piece trace, the session profile's p90/max): every test_cuda test with every
# tiny-llama fixture; then bench/serve-step.sh, four rounds side by side, default clients to
# mirror servers against cut servers (FERRY_CUDA_PIECE_CUT=1).
# .devF holds ferry.xz, test_cuda.xz and fx.tar.xz; carry [".devF"].
BIN=${BIN:-.devF}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
FERRY_TEST_BIN=$F timeout 330 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|PASSED|tests ran|SKIPPED|op cases|cuda     \]" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) served: local | unix | unix (cut servers) | tcp mirror | tcp cut"
SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECE_CUT=1" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | grep -E "t/s:|/ local|/ off"
echo "=== $(date -u +%T) done"

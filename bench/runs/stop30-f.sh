#!/usr/bin/env bash
# Run F (stop 30): the final head: every test_cuda test with every tiny-llama fixture, the
# served step with the servers' progressive pieces on (the default, 8) against off
# (FERRY_CUDA_PIECES=0), test-ops over both transports, and local tg128.
# .devF holds ferry.xz, test_cuda.xz and fx.tar.xz (every tiny-llama fixture); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
FERRY_TEST_BIN=$F timeout 300 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|\[ cuda.*(oracle|nmse|KL|early|op cases)" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) served: local | unix | unix, pieces off | tcp | tcp, pieces off"
CHECK=1 SERVER_AB=1 SERVER_ENV="FERRY_CUDA_PIECES=0" CLIENT_ENV="FERRY_REMOTE_FOLD=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | tail -16
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "tg128 f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "=== $(date -u +%T) done"

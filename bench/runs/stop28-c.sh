#!/usr/bin/env bash
# Run C (stop 28): the final head: every test_cuda test with every tiny-llama fixture (the
# session_logits refactor of the test helpers; q4_1, q5_k_m and q6_k carried this time), the served
# step with the default client (2 stripes on this host) against FERRY_REMOTE_STRIPES=1 side by
# side, and tg128.
# .devF holds ferry.xz, test_cuda.xz and fx.tar.xz (every tiny-llama fixture); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
timeout 300 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|\[ cuda" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) served: default clients (2 stripes) against FERRY_REMOTE_STRIPES=1"
CHECK=1 SERVER_AB=1 SERVER_ENV="FERRY_UNUSED=1" CLIENT_ENV="FERRY_REMOTE_STRIPES=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 5 128 2>&1 | tail -18
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "=== $(date -u +%T) done"

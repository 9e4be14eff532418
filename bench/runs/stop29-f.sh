#!/usr/bin/env bash
# Run F (stop 29): the final head: every test_cuda test with every tiny-llama fixture, the
# served step (unix and tcp against local, test-ops over both), and tg128 / tg512.
# .devF holds ferry.xz, test_cuda.xz and fx.tar.xz (every tiny-llama fixture); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
timeout 300 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|\[ cuda.*(oracle|nmse|KL|early|op cases)" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) served (three rounds)"
CHECK=1 OFF=0 DEVICE=CUDA0 bash bench/serve-step.sh $F $Q 3 128 2>&1 | tail -14
echo "=== $(date -u +%T) tg128 / tg512"
for r in 1 2; do echo "tg128 f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
R=3
echo "tg512 f16: $(tg $H 512)  q4_0: $(tg $Q 512)"
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run A (stop 28): every test_cuda test on stop 27's last commit (29e9d5e: one allow_dyn_smem
# helper for the ring and streaming kernels), which no GPU had run, plus this stop's two-GPU
# tests (SKIPPED on one GPU), with the tiny-llama fixtures but q4_1, q5_k_m and q6_k carried;
# then bench_tcp_stripes (tcp loopback, a 513 KB reply striped over 1-8 connections), the
# served step with striped tcp replies (the default client, 4 stripes on this host) against
# unstriped clients (FERRY_REMOTE_STRIPES=1) side by side, and tg128 as a check of the figures.
# .devF holds ferry.xz, test_cuda.xz, bench_tcp_stripes and fx/; carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test but the q4_1, q5_k_m and q6_k oracle cases (fixtures not carried)"
timeout 300 $TC --gtest_filter='-*q4_1*:*q5_k_m*:*q6_k*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) bench_tcp_stripes: 513,024 bytes (1B logits), then 2 MiB; $(nproc) threads"
$BIN/bench_tcp_stripes 513024 3000
$BIN/bench_tcp_stripes 2097152 1000
echo "=== $(date -u +%T) served, default clients against FERRY_REMOTE_STRIPES=1 (the 'off' columns)"
PROFILE=1 CHECK=1 SERVER_AB=1 SERVER_ENV="FERRY_UNUSED=1" CLIENT_ENV="FERRY_REMOTE_STRIPES=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 4 128 2>&1 | tail -30
echo "=== $(date -u +%T) served, default clients against FERRY_REMOTE_STRIPES=8"
OFF=1 SERVER_AB=1 SERVER_ENV="FERRY_UNUSED=1" CLIENT_ENV="FERRY_REMOTE_STRIPES=8" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 3 128 2>&1 | tail -16
echo "=== $(date -u +%T) tg128"
for r in 1 2; do echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"; done
echo "=== $(date -u +%T) done"

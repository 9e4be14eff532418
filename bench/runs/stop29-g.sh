#!/usr/bin/env bash
# Run G (stop 29): the review commit (one limit for the rows an early attention reloads, one
# place for k_attn_row's wait, a session helper in the tests): the attention, replay and
# oracle tests of the carried fixtures, and tg128. .devF holds ferry.xz, test_cuda.xz and
# fx.tar.xz (f16, q4_0, q8_0, q4_k_m); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
timeout 200 $TC --gtest_filter='Cuda.EarlyAttention*:Cuda.Chunked*:Cuda.LongDecode*:Cuda.SameLogits*:*CudaOracle.*/f16:*CudaOracle.*/q4_0:*CudaOracle.*/q8_0:*CudaOracle.*/q4_k_m:Cuda.Replayed*:Cuda.InPlace*' \
  > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|SKIPPED|early" $OUT/test_cuda.txt | head -20
wait
echo "=== $(date -u +%T) tg128"
R=3
echo "f16: $(tg $H 128)  q4_0: $(tg $Q 128)"
echo "=== $(date -u +%T) done"

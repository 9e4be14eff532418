#!/usr/bin/env bash
# Run E (stop 29): the streaming form's decode epilogue asks for the position, the cache row
# and the residual before its sums' shuffles, all at once, and computes the rope frequency of
# its first item before the wait (FERRY_CUDA_ROPE_EARLY, default on). Tests around the
# epilogue, then tg128 side by side: the binary of 7d8cbb1 (base), this one, and this one with
# FERRY_CUDA_ROPE_EARLY=0. .devF holds ferry.xz, ferry-base.xz, test_cuda.xz and fx.tar.xz (the
# f16, q4_0, q8_0 and q4_k_m fixtures); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
unpack ferry-base
NEW=$F
gen_models &
echo "=== $(date -u +%T) test_cuda (epilogues, rope, oracle cases of the carried fixtures)"
timeout 300 $TC --gtest_filter='Cuda.EveryOp*:Cuda.EarlyAttention*:Cuda.SameLogits*:*CudaOracle.*/f16:*CudaOracle.*/q4_0:*CudaOracle.*/q8_0:*CudaOracle.*/q4_k_m:Cuda.FusedKernels*:Cuda.FoldedNorm*:Cuda.StreamProducts*:Cuda.WideStream*:Cuda.ModelShaped*:Cuda.InPlace*:Cuda.Replayed*' \
  > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|op cases|early" $OUT/test_cuda.txt | head -30
# FusedDecodeMatchesUnfusedAndTheOracle reads f32 too (not carried): its other encodings here.
echo "=== $(date -u +%T) fused vs unfused decode (the carried encodings)"
timeout 200 $TC --gtest_filter='Cuda.FusedDecode*' > $OUT/test_fused.txt 2>&1
grep -E "step by step|FAILED|PASSED" $OUT/test_fused.txt | head
wait
echo "=== $(date -u +%T) tg128: base | new | new with FERRY_CUDA_ROPE_EARLY=0"
for r in 1 2 3; do
  for m in $Q $H; do
    F=/tmp/ferry-base; a=$(tg $m 128)
    F=$NEW; b=$(tg $m 128); c=$(tg $m 128 FERRY_CUDA_ROPE_EARLY=0)
    echo "$(basename $m .gguf): $a | $b | $c"
  done
done
echo "=== $(date -u +%T) done"

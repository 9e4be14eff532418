#!/usr/bin/env bash
# Run A (stop 26): the streaming form of the F16/BF16/Q4_0/Q6_K decode products (k_mv_stream)
# against the kernels it replaces (FERRY_CUDA_MV_STREAM=0): tg128 side by side, its tests,
# test-ops and the per-kernel profile. Binaries from bench/build-for-device.sh in .devbin (carry [".devbin"]).
BIN=.devbin
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) tg128, streaming form against the other kernels (STREAM=0)"
for r in 1 2 3; do echo "f16 stream: $(tg $H 128)   f16 STREAM=0: $(tg $H 128 FERRY_CUDA_MV_STREAM=0)"; done
for r in 1 2 3; do echo "q4_0 stream: $(tg $Q 128)   q4_0 STREAM=0: $(tg $Q 128 FERRY_CUDA_MV_STREAM=0)"; done
echo "tiny q8_0: $(tg $T 128)"
echo "=== $(date -u +%T) test_cuda (stream, folded norm, fused decode, oracle cases carried)"
timeout 240 $TC --gtest_filter='*Stream*:*FoldedNorm*:*RawFloat*:*BlockLane*:*RingProducts*:*RingDecode*:*FusedDecode*:*SameLogits*:*ModelShaped*:*FusedKernelsNever*:*InPlace*:*ReplayedGraph*:*LongDecode*:*Alternating*:Encodings/CudaOracle.*/f16:Encodings/CudaOracle.*/q8_0:Encodings/CudaOracle.*/q4_0:Encodings/CudaOracle.*/q4_k_m' > $OUT/test_cuda.txt 2>&1
grep -E "OK \]|FAILED|Failure|PASSED|tests ran|nmse|NMSE|KL" $OUT/test_cuda.txt | head -70
echo "=== $(date -u +%T) test-ops CUDA0"
timeout 200 $F test-ops --backend CUDA0 > $OUT/ops.txt 2>&1; grep -E "FAIL" $OUT/ops.txt | head; tail -1 $OUT/ops.txt
echo "=== $(date -u +%T) kernel profile, 1B F16 and Q4_0 tg32"
for m in $H $Q; do
  FERRY_CUDA_PROFILE=1 $F bench -m $m --device CUDA0 -p 0 -n 32 -r 1 2>&1 | head -24
  FERRY_CUDA_PROFILE=1 FERRY_CUDA_MV_STREAM=0 $F bench -m $m --device CUDA0 -p 0 -n 32 -r 1 2>&1 | head -24
done
echo "=== $(date -u +%T) done"

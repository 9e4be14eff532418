#!/usr/bin/env bash
# (The L2 prefetch and FERRY_SOCKET_BUF switches were removed after this run: both lost; see
# bench/results/cuda.md, stop 27.)
# Run C (stop 27): the staged streaming form (FERRY_CUDA_MV_STAGE=1: F16/BF16 pieces in flight
# in shared memory by cp.async, 3 a warp where they fit) and the decode attention's L2 prefetch
# of the gate/up weights (FERRY_CUDA_L2_PREFETCH=MiB), each against the default side by side;
# their tests first. Carry [".devF"] (f16, f32 and q4_0 fixtures used).
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: staged and prefetch tests, stream, fused decode"
timeout 200 $TC --gtest_filter='*Staged*:*StreamProducts*:*FusedDecode*:*SameLogits*:*FusedKernelsNever*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|OK \]" $OUT/test_cuda.txt | head -30
wait
echo "=== $(date -u +%T) tg128: default | STAGE=1 | L2_PREFETCH=16 | L2_PREFETCH=32 | both (16)"
for m in $H $Q; do
  echo "$(basename $m)"
  for r in 1 2 3; do
    echo "  $(tg $m 128) | $(tg $m 128 FERRY_CUDA_MV_STAGE=1) | $(tg $m 128 FERRY_CUDA_L2_PREFETCH=16) | $(tg $m 128 FERRY_CUDA_L2_PREFETCH=32) | $(tg $m 128 FERRY_CUDA_MV_STAGE=1 FERRY_CUDA_L2_PREFETCH=16)"
  done
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run E (stop 26): more Q4_0 / Q6_K pieces in flight per warp in the streaming form
# (FERRY_CUDA_MV_STREAM_DEEP=1: 6 and 4 against 4 and 3), tg128 side by side, and the
# streaming tests with it. Carry [".devbin"]. The switch was never committed (slower): to
# rerun, build with SBlkPiece::kD at 6 for Q4_0 and 4 for Q6_K and drop the DEEP=1 columns.
BIN=.devbin
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) tg128 1B Q4_0, DEEP=1 against the default"
for r in 1 2 3; do echo "q4_0: $(tg $Q 128)   q4_0 DEEP=1: $(tg $Q 128 FERRY_CUDA_MV_STREAM_DEEP=1)"; done
echo "f16: $(tg $H 128)"
echo "=== $(date -u +%T) tests with DEEP=1"
FERRY_CUDA_MV_STREAM_DEEP=1 timeout 120 $TC --gtest_filter='*StreamProducts*:*SameLogits*:Encodings/CudaOracle.*/q4_0:Encodings/CudaOracle.*/q4_k_m' 2>&1 | grep -E "^\[ cuda|OK \]|FAILED|Failure|PASSED"
echo "=== $(date -u +%T) done"

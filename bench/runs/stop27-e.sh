#!/usr/bin/env bash
# (FERRY_CUDA_MV_STAGE was removed after this run: slower; see bench/results/cuda.md, stop 27.)
# Run E (stop 27): the staged streaming form again (run C's build set the shared-memory limit
# of one of its three kernels only: launches failed), its tests, 1B F16 tg128 staged against
# the register form side by side; then the served ratios with servers spinning by default
# (kServerSpinNs), served test-ops first. Carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: staged tests, stream, fused decode"
timeout 150 $TC --gtest_filter='*Staged*:*StreamProducts*:*FusedDecode*:*SameLogits*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|OK \]" $OUT/test_cuda.txt | head -30
wait
echo "=== $(date -u +%T) 1B F16 tg128: default | STAGE=1"
for r in 1 2 3 4; do echo "  $(tg $H 128) | $(tg $H 128 FERRY_CUDA_MV_STAGE=1)"; done
echo "  tiny f16: $(tg $BIN/fx/tiny-llama-f16.gguf 128) | $(tg $BIN/fx/tiny-llama-f16.gguf 128 FERRY_CUDA_MV_STAGE=1)"
echo "=== $(date -u +%T) served (servers spin by default now): local | unix | tcp"
DEVICE=CUDA0 OFF=0 CHECK=1 bash bench/serve-step.sh $F $Q 5 128 > $OUT/serve.log 2>&1
grep -E "median|ratio|passed" $OUT/serve.log | head -20
echo "=== $(date -u +%T) done"

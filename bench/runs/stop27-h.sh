#!/usr/bin/env bash
# Run H (stop 27): the default build after run G (one 16-warp block per SM for Q4_0/Q6_K wo and
# down): its tests, tg128 of the benchmark models, the served ratios. Carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
timeout 120 $TC --gtest_filter='*WideStream*:*FusedDecode*:*SameLogits*:Encodings/CudaOracle.*/q4_0:Encodings/CudaOracle.*/f16' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|OK \]|KL" $OUT/test_cuda.txt | head -30
wait
echo "=== $(date -u +%T) tg128"
for r in 1 2 3; do echo "q4_0: $(tg $Q 128)  f16: $(tg $H 128)"; done
echo "tiny q8_0: $(tg $T 128)"
echo "=== $(date -u +%T) served: local | unix | tcp"
DEVICE=CUDA0 OFF=0 bash bench/serve-step.sh $F $Q 4 128 > $OUT/serve.log 2>&1
grep -E "median|ratio" $OUT/serve.log | head -20
echo "=== $(date -u +%T) done"

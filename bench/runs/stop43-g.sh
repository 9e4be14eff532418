#!/usr/bin/env bash
# Stop 43, call G: the next step's first weights asked for in L2 at the end of a captured step
# (FERRY_CUDA_L2_FIRST=KiB, an experiment: one small launch after the output product asks for
# that much of the first products' weights, layer 0's q/k/v, wo, then gate/up). Call C's
# timeline (H100, F16): ~35-39 us from one step's output product to the next step's first
# block, DRAM idle, and the first q/k/v then waits for its copies from DRAM. Prediction (before
# the run): 12-24 MiB +0.3-0.8% for F16/BF16 (the extra launch adds ~2-3 us before the host
# sees the step end; 12.6 MB of q/k/v from L2 saves ~4 us), Q4_0 about the same.
# Carry [".dev6"].
BIN=.dev6 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
FERRY_CUDA_L2_FIRST=24576 tests "*EarlyAttention*:*Replayed*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 60)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default | L2_FIRST=12 MiB | 24 MiB | 40 MiB"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  for m in $H $B $Q; do
    echo "round $r $(basename $m): $(b $m) | $(FERRY_CUDA_L2_FIRST=12288 b $m) | $(FERRY_CUDA_L2_FIRST=24576 b $m) | $(FERRY_CUDA_L2_FIRST=40960 b $m)"
  done
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

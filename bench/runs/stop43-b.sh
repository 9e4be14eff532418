#!/usr/bin/env bash
# Stop 43, call B: where gate/up's first weights are asked for in L2. Call A (H100): asked by
# the attention after its wait, 4 / 8 / 16 MiB lost 0.6 / 0.9 / 3% (F16): the attention's
# prologue went 1.70 -> 4.55 us at 8 MiB (its SMs issue the prefetch beside its own loads)
# while gate/up's fell 6.67 -> 5.14; asked at the attention's start (AT=1, during q/k/v) 8 MiB
# gained 1.0% (F16) and lost 2.5% (Q4_0, whose q/k/v is short). gate/up's copies before its
# wait are its first 2,112 items (264 blocks x 8 warps, a gate and an up row each): 16.5 MiB.
# Now also AT=2: wo's blocks (every SM) ask once their own first copies are issued, so the
# prefetch queues behind them and the attention's SMs carry 1/132 of it.
# Prediction (before the run): AT=2 8-16 MiB F16 +1.5-3%, AT=1 16 MiB about AT=1 8 MiB;
# the knob off costs nothing against call A's binary (old.xz). Carry [".dev2"].
BIN=.dev2 source bench/runs/common.sh
old_binary .dev2/old.xz
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
echo "=== $(date -u +%T) test_cuda"
tests "*EarlyAttention*:*Replayed*:*FusedKernelsNever*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 120)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: off | call A's binary | AT=1 8 MiB | AT=1 16 MiB | AT=2 8 MiB | AT=2 16 MiB | AT=2 24 MiB"
for r in 1 2 3; do
  left 50 "round $r" || break
  echo "round $r: F16 $(b $H) | $(old $H --device CUDA0) | $(FERRY_CUDA_L2_NEXT_AT=1 FERRY_CUDA_L2_NEXT=8192 b $H) | $(FERRY_CUDA_L2_NEXT_AT=1 FERRY_CUDA_L2_NEXT=16384 b $H) | $(FERRY_CUDA_L2_NEXT_AT=2 FERRY_CUDA_L2_NEXT=8192 b $H) | $(FERRY_CUDA_L2_NEXT_AT=2 FERRY_CUDA_L2_NEXT=16384 b $H) | $(FERRY_CUDA_L2_NEXT_AT=2 FERRY_CUDA_L2_NEXT=24576 b $H)"
done
echo "=== $(date -u +%T) Q4_0 tg128: off | call A's binary | AT=1 2 MiB | AT=1 4 MiB"
for r in 1 2 3; do
  left 40 "Q4_0 round $r" || break
  echo "round $r: Q4_0 $(b $Q) | $(old $Q --device CUDA0) | $(FERRY_CUDA_L2_NEXT_AT=1 FERRY_CUDA_L2_NEXT=2048 b $Q) | $(FERRY_CUDA_L2_NEXT_AT=1 FERRY_CUDA_L2_NEXT=4096 b $Q)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

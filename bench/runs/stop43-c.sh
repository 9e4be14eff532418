#!/usr/bin/env bash
# Stop 43, call C: the default now asks for an eighth of gate/up's weights in L2 at the early
# attention's start (FERRY_CUDA_L2_NEXT=0: none; =KiB: that much). Calls A-B (H100): at the
# start, 8 MiB gained 1.0% and 1.5% (F16), Q4_0 2 MiB +1.1%, 4 MiB +0.8%, 8 MiB -2.5%; after
# the attention's wait, or from wo's blocks, it lost or gained less. An eighth is 8.4 MB for
# 1B F16/BF16, 2.4 MB for Q4_0. Prediction (before the run): F16/BF16 +1-1.5%, Q4_0 +0.5-1%,
# tiny-llama Q8_0 within the spread; in the trace, gate/up's prologue -1 to -2 us and the
# attention unchanged. (.dev3: this build, its tests and fixtures; .devT3: its trace build.)
# Carry [".dev3", ".devT3"].
BIN=.dev3 source bench/runs/common.sh
TRACE_BIN=.devT3
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
tests "*EarlyAttention*:*Replayed*:*FusedKernelsNever*:*LongDecode*:*CudaOracle*/f16:*CudaOracle*/q4_0:*CudaOracle*/q8_0" $(cap 150)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default | L2_NEXT=0 (F16 also 6 MiB | 12 MiB)"
for r in 1 2 3 4; do
  left 60 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_L2_NEXT=0 b $H) | $(FERRY_CUDA_L2_NEXT=6144 b $H) | $(FERRY_CUDA_L2_NEXT=12288 b $H)" \
    "  BF16 $(b $B) | $(FERRY_CUDA_L2_NEXT=0 b $B)  Q4_0 $(b $Q) | $(FERRY_CUDA_L2_NEXT=0 b $Q)  tiny $(b $T) | $(FERRY_CUDA_L2_NEXT=0 b $T)"
done
left 30 "timeline" && timeline default
left 30 "timeline" && timeline off FERRY_CUDA_L2_NEXT=0
left 60 "bench" && for m in $H $Q; do $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"; done
echo "=== $(date -u +%T) done at ${SECONDS}s"

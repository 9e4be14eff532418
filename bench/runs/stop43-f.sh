#!/usr/bin/env bash
# Stop 43, call F: more of gate/up asked for in L2, by q/k/v's warps as each ends
# (FERRY_CUDA_L2_QKV=KiB, an experiment; the bulk form only: F16/BF16), beside the attention's
# eighth (the default since d641b72). Call C's timeline (H100, F16): from down's end to wo's end
# 16.2 us for 21 MB (6.7 us of transfer at the 3.15 TB/s the output product reaches); gate/up
# 22.5 us for 67 MB (21.3), down 11.5 for 33.5 (10.6): the layer's bubble is in the q/k/v ->
# attention -> wo chain, which the attention's 8.4 MB fill 2.7 us of. Asked for as q/k/v's
# warps end, after their own weights have landed, more of it would not delay q/k/v's copies
# (which the attention's ask, during q/k/v, does: q/k/v 7.86 -> 8.93 us).
# Prediction (before the run): 4-8 MiB F16/BF16 +0.5-1%; 16 MiB delays wo's copies and gains
# less. Then the session profiles (local, unix, tcp) of 1B Q4_0 tg128.
# (.dev5: this build and its tests' fixtures; .devT5: its trace build.) Carry [".dev5", ".devT5"].
BIN=.dev5 source bench/runs/common.sh
TRACE_BIN=.devT5
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
FERRY_CUDA_L2_QKV=8192 tests "*EarlyAttention*:*FusedKernelsNever*:*BulkStreamEquals*:*CudaOracle*/f16" $(cap 90)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default | L2_QKV=4 MiB | 8 MiB | 16 MiB | L2_NEXT=0"
for r in 1 2 3 4; do
  left 50 "round $r" || break
  for m in $H $B; do
    echo "round $r $(basename $m): $(b $m) | $(FERRY_CUDA_L2_QKV=4096 b $m) | $(FERRY_CUDA_L2_QKV=8192 b $m) | $(FERRY_CUDA_L2_QKV=16384 b $m) | $(FERRY_CUDA_L2_NEXT=0 b $m)"
  done
done
left 30 "timeline" && timeline qkv8 FERRY_CUDA_L2_QKV=8192
echo "=== $(date -u +%T) profiles"
left 60 "profiles" && { serve_unix; serve_tcp 0; echo "listening: $(servers_up)"; profiles local unix:$SD/u tcp:127.0.0.1:$P local unix:$SD/u tcp:127.0.0.1:$P; }
echo "=== $(date -u +%T) done at ${SECONDS}s"

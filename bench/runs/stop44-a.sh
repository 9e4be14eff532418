#!/usr/bin/env bash
# Stop 44, call A: the output projection folded into the short decode attention (k_attn_row's
# wo form, op_attn_wo; FERRY_CUDA_ATTN_WO=0: wo's own product as before). Block (h, p) loads
# its 512 rows x 64 columns of wo (1B F16: 64 KiB) into registers with the keys, before the
# wait; once head h's output is in shared memory it writes 512 partials, and the last block of
# each part adds the 32 heads' partials in order and the residual. 128 blocks for 1B F16/BF16;
# Q4_0's and Q8_0's wo stay separate products. Prediction (before the run): 1B F16/BF16 tg128
# +3-5% (wo's boundary and its ~4 us after the attention become ~2 us of the attention's
# tail), Q4_0 and tiny-llama unchanged. Also the first run of 2b5a294 (the ask by bandwidth,
# `ferry devices`) and of 5eb6b77/ad5e6f9 (test_cuda's host threads).
# (.dev9: this build, its tests and fixtures; .devT9: its trace build.) Carry [".dev9", ".devT9"].
BIN=.dev9 source bench/runs/common.sh
TRACE_BIN=.devT9
nvidia-smi --query-gpu=name --format=csv,noheader
$F devices 2>&1 | head -5
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
tests "*FoldedOutputProjection*:*EarlyAttention*:*SameLogits*:*Replayed*:*FusedKernelsNever*:*LongDecode*:*InPlace*:*Alternating*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 200)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default (folded) | FERRY_CUDA_ATTN_WO=0"
for r in 1 2 3 4; do
  left 45 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_ATTN_WO=0 b $H)  BF16 $(b $B) | $(FERRY_CUDA_ATTN_WO=0 b $B)  Q4_0 $(b $Q)"
done
left 30 "timeline" && timeline folded
left 30 "timeline" && timeline separate FERRY_CUDA_ATTN_WO=0
left 40 "bench" && $F bench -m $H --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"
echo "=== $(date -u +%T) done at ${SECONDS}s"

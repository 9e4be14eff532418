#!/usr/bin/env bash
# Stop 55, call F: the store of the logits into the session's read memory, until now the
# persistent step's alone (stop 54: +1.7% on an H100), generalized: the backend owns the word
# that names the host memory (OpContext::host_out), and the graph's last product in the
# streaming form (the kernel plan's logits: Q4_0's Q6_K output, BF16, F16 with the step off)
# stores its rows there too, each warp's run of 8 rows as one line. The whole of test_cuda,
# then 1B tg128 rows, FERRY_CUDA_HOST_READ=0 (the copy) | default: Q4_0, BF16, F16 plan
# (FERRY_CUDA_PERSIST=0), F16 default. Prediction: Q4_0 +1.5-2.5% (9-15 us of a ~550 us step),
# BF16 and the F16 plan +1-1.5%, the F16 step unchanged.
# .dev55: ferry.xz, test_cuda.xz, fx.tar.xz (every tiny-llama fixture but the Q8_0 file, which
# is the repository's models/tiny-llama-q8_0.gguf). Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
(gen_models; gen_types bf16) > /dev/null 2>&1 &
GEN=$!
tests "*" $(cap 200)
grep "logits stored into the read" $OUT/test_cuda.*.txt | head -4
wait $GEN
B=/tmp/bf16.gguf
for r in 1 2 3; do
  left 45 "round $r" || break
  echo "round $r Q4_0 $(R=3 tg $Q 128 FERRY_CUDA_HOST_READ=0) | $(R=3 tg $Q 128)  BF16 $(R=3 tg $B 128 FERRY_CUDA_HOST_READ=0) | $(R=3 tg $B 128)  F16 plan $(R=3 tg $H 128 FERRY_CUDA_PERSIST=0 FERRY_CUDA_HOST_READ=0) | $(R=3 tg $H 128 FERRY_CUDA_PERSIST=0)  F16 $(R=3 tg $H 128 FERRY_CUDA_HOST_READ=0) | $(R=3 tg $H 128)"
done
date +%T

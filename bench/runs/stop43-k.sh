#!/usr/bin/env bash
# Stop 43, call K (the same H200 as call J): more rounds of the L2 ask against none, F16 and
# BF16 (call J: F16 1,188.8-1,195.6 against 1,192.9-1,203.8, Q4_0 alike). Carry [".dev8"].
BIN=.dev8 source bench/runs/common.sh
gen_models
gen_types bf16
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default | L2_NEXT=0 | 4 MiB"
for r in 1 2 3 4 5; do
  left 25 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_L2_NEXT=0 b $H) | $(FERRY_CUDA_L2_NEXT=4096 b $H)  BF16 $(b /tmp/bf16.gguf) | $(FERRY_CUDA_L2_NEXT=0 b /tmp/bf16.gguf)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

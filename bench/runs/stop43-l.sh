#!/usr/bin/env bash
# Stop 43, call L (the same H200 as calls J-K): a sixteenth instead of an eighth. Call K, five
# rounds, F16 medians: an eighth 1,180.7, none 1,187.1, 4 MiB 1,196.4. Carry [".dev8"].
BIN=.dev8 source bench/runs/common.sh
gen_models
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: F16 none | 4 MiB | 2 MiB  Q4_0 none | 1.2 MiB"
for r in 1 2 3 4; do
  left 20 "round $r" || break
  echo "round $r: F16 $(FERRY_CUDA_L2_NEXT=0 b $H) | $(FERRY_CUDA_L2_NEXT=4096 b $H) | $(FERRY_CUDA_L2_NEXT=2048 b $H)  Q4_0 $(FERRY_CUDA_L2_NEXT=0 b $Q) | $(FERRY_CUDA_L2_NEXT=1200 b $Q)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Stop 43, call J: an H200 came (call I). The L2 ask (default) against FERRY_CUDA_L2_NEXT=0
# side by side, then `ferry bench -p 512 -n 128 -r 5` of 1B F16 and Q4_0, with the ~200 s of
# device time left. Carry [".dev8"] (this session's HEAD binaries).
BIN=.dev8 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: default | L2_NEXT=0"
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_L2_NEXT=0 b $H)  Q4_0 $(b $Q) | $(FERRY_CUDA_L2_NEXT=0 b $Q)"
done
for m in $H $Q; do
  left 20 "bench $m" && $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

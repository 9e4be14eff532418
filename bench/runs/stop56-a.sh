#!/usr/bin/env bash
# Stop 56, call A: on an H200, stop55-k's measurements (the F16 target: 1B F16 tg128 plan |
# default three rounds; `ferry bench -p 512 -n 128 -r 5` for F16 and Q4_0 with the GPU memory
# line of 77d8717, its first run; served 1B Q4_0 local | unix | tcp three rounds). On any other
# card only the memory line's first run (1B Q4_0, -r 1) and nothing more.
# Binaries of 73b2896 (.dev56: ferry.xz). Carry [".dev56"].
# Prediction on an H200: F16 tg128 ~1,340 (stop 53: 1,314 with the copy; the store +1.7% on an
# H100); unix ~0.97; tcp ~0.95 or just under (local gained the store, tcp's reads do not).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
BIN=${BIN:-.dev56} source bench/runs/common.sh
if [[ $CARD != *H200* ]]; then
  $F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
  $F bench -m $Q --device CUDA0 -p 512 -n 128 -r 1 2>&1 | grep -E "pp512|tg128|memory|MiB"
  exit 0
fi
gen_models
for r in 1 2 3; do
  left 30 "F16 round $r" || break
  echo "F16 tg128 plan | default: $(R=5 tg $H 128 FERRY_CUDA_PERSIST=0) | $(R=5 tg $H 128)"
done
for m in $H $Q; do
  left 40 "bench $(basename $m)" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|memory|MiB"
done
left 60 "served" || exit 0
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 3
date +%T

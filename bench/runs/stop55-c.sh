#!/usr/bin/env bash
# Stop 55, call C: call B (H100) showed the context alone costs tg128 2.4-2.8%: 1B F16
# default 1,085 -> 1,059 t/s with -c 528, Q4_0 1,790 -> 1,745 (the plan's F16 -0.8%); pp512
# first costs ~0.5% more. Is it the attended length (n_kv: min(ctx, 256)) or the caches' rows
# (ctx)? tg128 rows of -c 144 (n_kv 144) | 200 (200) | 256 (256) | 1040 (256, 4x the rows):
# F16 default, F16 plan, Q4_0. Prediction: n_kv, not the rows. Then per-kernel profiles.
# .dev55: ferry.xz (bench/build-for-device.sh). Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gen_models
for r in 1 2; do
  for v in "$H" "$H FERRY_CUDA_PERSIST=0" "$Q"; do
    left 40 "$v round $r" || break
    row="$(echo $v | sed 's|/tmp/llama-1b-||')":
    set -- $v
    for c in 144 200 256 1040; do row="$row $(R=5 tg $1 128 ${2:-} -c $c) |"; done
    echo "$row"
  done
done
# Each step timed by events (FERRY_CUDA_PROFILE=1, no graphs): where the time goes at -c 144
# and -c 528, F16 default and Q4_0 (the top rows).
for m in $H $Q; do
  for c in 144 528; do
    left 25 "profile $c" || break
    echo "--- profile $(basename $m) -c $c"
    FERRY_CUDA_PROFILE=1 $F bench -m $m --device CUDA0 -p 0 -n 128 -r 1 -c $c 2>&1 | grep -A8 "profile:"
  done
done
date +%T

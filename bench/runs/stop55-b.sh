#!/usr/bin/env bash
# Stop 55, call B: why tg128 after pp512 (`-p 512 -n 128`, the peer's llama-bench command) was
# 3% slower than tg128 alone (`-p 0 -n 128`) on an H200 in stop 53. The tg test's context is
# the longer test's tokens + 16: 144 alone, 528 after pp512, so its graph attends 144 keys
# alone and 256 (the kv pad) after it. bench's new -c separates that from the prompt test
# having run: 1B F16 and Q4_0, default | plan (FERRY_CUDA_PERSIST=0), rows of
# -p 0 -n 128 | -p 0 -n 128 -c 528 | -p 512 -n 128 (its pp512, then its tg128).
# Prediction: the persistent step's attention scans masked keys past the position almost for
# free, so -c 528 costs <0.5%; any larger loss is the pp512 run's (clocks, placement).
# .dev55: ferry.xz (bench/build-for-device.sh). Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gen_models
row() { # MODEL [FERRY_*=V]
  local m=$1; shift
  local a=$(env "$@" $F bench -m $m --device CUDA0 -p 0 -n 128 -r 5 | awk -F'|' '$7 ~ /tg/ {print $8}')
  local b=$(env "$@" $F bench -m $m --device CUDA0 -p 0 -n 128 -c 528 -r 5 | awk -F'|' '$7 ~ /tg/ {print $8}')
  local c=$(env "$@" $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 | awk -F'|' '$7 ~ /pp|tg/ {printf "%s", $8}')
  echo "$a | $b | $c"
}
for r in 1 2; do
  for m in $H $Q; do
    left 60 "$(basename $m) round $r" || break
    echo "$(basename $m) default: $(row $m)"
    echo "$(basename $m) plan:    $(row $m FERRY_CUDA_PERSIST=0)"
  done
done
date +%T

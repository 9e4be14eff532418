#!/usr/bin/env bash
# Stop 42, call K: the evict-first weights on whatever card comes (an H200 wanted for the
# targets): cc0e900's ferry (.dev4) against 74babe0's (.devM), 1B F16 / BF16 / Q4_0 tg128 side
# by side; then cc0e900's `ferry bench -p 512 -n 128 -r 5` (tiny-llama Q8_0: tg only) and
# served side by side (local | unix | tcp).
# Carry [".dev4", ".devM"].
BIN=.dev4 source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1
old_binary .devM/ferry.xz
echo "=== $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
echo "=== $(date -u +%T) tg128: new | before"
for r in 1 2 3; do
  left 60 "round $r" || break
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)" \
    " Q4_0 $(bt $Q --device CUDA0) | $(old $Q --device CUDA0)"
done
echo "=== $(date -u +%T) ferry bench, new"
for m in $H /tmp/bf16.gguf $Q; do
  left 50 "bench $m" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "^\| llama|peak"
done
$F bench -m $T --device CUDA0 -p 0 -n 128 -r 5 2>&1 | grep -E "^\| llama"
left 120 "served" || exit 0
echo "=== $(date -u +%T) served"
served_side_by_side
echo "=== $(date -u +%T) done at ${SECONDS}s"

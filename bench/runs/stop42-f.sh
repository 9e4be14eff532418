#!/usr/bin/env bash
# Stop 42, call F: the evict-first weights (cc0e900's ferry, .dev4) against the binary before
# them (74babe0, .devM), 1B F16 / BF16 / Q4_0 and tiny-llama Q8_0 tg128 side by side; then the
# new binary's `ferry bench -p 512 -n 128 -r 5`, served side by side (local | unix | tcp), and
# the per-kernel timeline of one F16 step (.devT3: the same source with -DFERRY_CUDA_TRACE).
# Carry [".dev4", ".devM", ".devT3"].
BIN=.dev4 source bench/runs/common.sh
TRACE_BIN=.devT3
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1
old_binary .devM/ferry.xz
echo "=== $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
echo "=== $(date -u +%T) tg128: new | before"
for r in 1 2 3; do
  left 60 "round $r" || break
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)" \
    " Q4_0 $(bt $Q --device CUDA0) | $(old $Q --device CUDA0)" \
    " tiny Q8_0 $(bt $T --device CUDA0) | $(old $T --device CUDA0)"
done
echo "=== $(date -u +%T) ferry bench, new"
for m in $H /tmp/bf16.gguf $Q; do
  left 60 "bench $m" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "^\||peak"
done
timeline f16
left 150 "served" || exit 0
echo "=== $(date -u +%T) served"
served_side_by_side
echo "=== $(date -u +%T) done at ${SECONDS}s"

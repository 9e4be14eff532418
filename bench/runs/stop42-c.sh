#!/usr/bin/env bash
# Stop 42, call C: weights marked evict-first in L2 (-DFERRY_CUDA_EVICT_FIRST: the bulk copies'
# and the register forms' weight loads carry an L2::evict_first cache policy), .dev2, against
# main's binary (.devM), side by side. 2.5 GB of weights a token pass through the 50 MB L2;
# evict-first leaves it to what is read again within the step (activations, the KV cache,
# the kernels' code, whose instruction-cache misses otherwise go to DRAM under full load).
# Prediction (written before the run): the latency-bound phases (attention, prologues, the
# epilogues' round trips) shorter: 1B F16 and Q4_0 tg128 +1-3%.
# Carry [".dev2", ".devM"].
BIN=.dev2 source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
old_binary .devM/ferry.xz
wait
echo "=== $(date -u +%T) tg128: new | main"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " Q4_0 $(bt $Q --device CUDA0) | $(old $Q --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

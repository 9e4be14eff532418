#!/usr/bin/env bash
# Stop 52, call A: the persistent decode step built into the CUDA backend (src/backends/cuda/
# ops/persist.cu, lowered by persist-plan.cpp). First its test against the kernel-per-node
# plan (test_cuda Cuda.PersistentDecodeMatchesTheKernelPlan), then why a 1B F16 decode graph
# is or is not lowered (FERRY_CUDA_PERSIST_WHY=1), then 1B F16 tg128 with the persistent step
# off (FERRY_CUDA_PERSIST=0, today's plan) and on, alternating, on the same card.
# Prediction (stop 51-d's prototype on an H100: 0.862-0.871 of ferry's own step): ~0.87-0.90 of
# the plan's step time on the same card, i.e. tg128 t/s x 1.11-1.15.
# .dev52: ferry.xz, test_cuda.xz, fx.tar.xz (the tiny-llama fixtures but q4_1 and q5_k_m).
# Carry [".dev52"].
# Ran once (H100, 02:36 UTC) in its first form (the two persistent tests, why, three rounds;
# the binaries then ran the step by default): no graph was lowered ("q's rope": the last
# layer's row picked by out_ids), tg128 967 t/s both ways. Since then: 4 rounds, both forms
# named explicitly (the step is off by default), and the whole of test_cuda and test-ops.
BIN=${BIN:-.dev52} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
tests 'Cuda.Persistent*' $(cap 240)
grep "persistent decode vs\|not one persistent" $OUT/test_cuda.*.txt | sort | uniq -c | head -20
date +%T
left 100 "1B F16" && { [ -f $H ] || $F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1; }
date +%T
left 40 "why" && FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_WHY=1 timeout 40 $F bench -m $H --device CUDA0 -p 0 -n 16 -r 1 2>&1 |
  grep -E "persistent|tg16|rror" | sort | uniq -c | head
for r in 1 2 3 4; do
  left 50 "round $r" || break
  echo "round $r plan: $(FERRY_CUDA_PERSIST=0 bt $H --device CUDA0)  persistent: $(FERRY_CUDA_PERSIST=1 bt $H --device CUDA0)"
done
date +%T
# The whole of test_cuda (the tiny-llama fixtures but q4_1 and q5_k_m: the carry's limit) and
# test-ops on CUDA0, with the persistent step as built.
tests "*" $(cap 240)
left 60 "test-ops" && { timeout $(cap 90) $F test-ops --backend CUDA0 2>&1 | tail -n 2; }
date +%T

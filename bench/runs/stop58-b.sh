#!/usr/bin/env bash
# Stop 58, call B (any card): the persistent decode step's quantized form (Q4_0 layers, a Q4_0
# or Q6_K output; weights as int8 dp4a products against the input quantized a block of 32, as
# the kernel plan's int8 products do). Binaries of the working tree (.dev58b; carry
# [".dev58b"]; built from branch persist-quant, 1a75a4d less its stamps). First its tests (the plan against the step for F16, BF16 and the two Q4_0
# models: nmse <= 1e-6 for Q4_0; the lowering), then 1B Q4_0 tg128 plan | step, three rounds
# (prediction: the layers' ~16 us a layer of kernel boundaries mostly gone, 1,840 -> 2,300-2,600
# on an H100), the copies in flight swept, and F16 plan | step (unchanged, a check).
BIN=${BIN:-.dev58b} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(gen_models) > /dev/null 2>&1 &
GEN=$!
tests "Cuda.Persistent*" $(cap 240)
wait $GEN
echo "lowered? $(FERRY_CUDA_PERSIST_WHY=1 $F bench -m $Q --device CUDA0 -p 0 -n 16 -r 1 2>&1 | grep -E 'not one persistent|tg16' | head -3)"
echo "--- 1B Q4_0 tg128 (-p 0 -r 5): plan | step"
for r in 1 2 3; do
  left 30 "Q4_0 round $r" || break
  echo "$(tg $Q 128 FERRY_CUDA_PERSIST=0) | $(tg $Q 128)"
done
row="Q4_0 tg128 inflight"
for k in 6,2 8,3 14,3 14,5 20,6 28,8; do
  left 20 "inflight $k" || break
  row="$row | $k $(tg $Q 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
done
echo "$row | default $(tg $Q 128)"
left 30 "F16" && echo "F16 tg128 plan | step: $(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
bench_tables 3 $Q
left 60 "tg512" && echo "Q4_0 tg512 plan | step: $(tg $Q 512 FERRY_CUDA_PERSIST=0) | $(tg $Q 512)"
date +%T

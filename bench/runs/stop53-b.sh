#!/usr/bin/env bash
# Stop 53, call B: after call A (H200: the step's tests pass; tg128 1,314 t/s against the
# plan's 1,203, but tg512 1,140 against 1,168), the attention's values after its wait loaded 8
# at a time (they were loaded one at a time), and the step on by default up to 256 keys.
# The two persistent tests, then 1B F16 tg128 and tg512, side by side: the plan
# (FERRY_CUDA_PERSIST=0) | the default | every graph lowered (=1). Prediction: tg128 as call
# A's (the loop runs only past 128 keys); tg512 with =1 from 0.976 of the plan's to ~1.0-1.03;
# the default's tg512 between.
# .dev53: ferry.xz, test_cuda.xz (bench/build-for-device.sh at 94e6c15 + the value batches).
# Carry [".dev53"].
BIN=${BIN:-.dev53} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
$F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1 &
GEN=$!
tests 'Cuda.Persistent*' $(cap 120)
grep "persistent decode vs\|persistent decode queued" $OUT/test_cuda.*.txt | head
wait $GEN
t() { FERRY_CUDA_PERSIST=$1 $F bench -m $H --device CUDA0 -p 0 -n $2 -r ${3:-3} 2>&1 | awk -F'|' '$7 ~ /tg/ { split($8, v, " "); print v[1] }'; }
echo "--- tg128: plan | default | all"
for r in 1 2; do echo "$(t 0 128 5) | $(t '' 128 5) | $(t 1 128 5)"; done
echo "--- tg512: plan | default | all"
for r in 1 2; do left 40 "tg512 round $r" && echo "$(t 0 512 2) | $(t '' 512 2) | $(t 1 512 2)"; done
echo "--- tg1024: plan | default | all"
left 40 "tg1024" && echo "$(t 0 1024 1) | $(t '' 1024 1) | $(t 1 1024 1)"
date +%T

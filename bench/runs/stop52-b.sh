#!/usr/bin/env bash
# Stop 52, call B: call A cut to what ~4 minutes of device time hold. The persistent step's
# tests (after call A's first run found every decode graph falling back at the last layer's
# out_ids row: fixed), then 1B F16 tg128 with the step off (FERRY_CUDA_PERSIST=0) and on, two
# rounds side by side. Prediction as call A's: tg128 x 1.11-1.15 on the same card.
# .dev52: ferry.xz, test_cuda.xz from bench/build-for-device.sh at this stop's last commit.
# Carry [".dev52"]. Not run in stop 52 (no device time was left).
BIN=${BIN:-.dev52} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
date +%T
tests 'Cuda.Persistent*' 90
grep "persistent decode\|not one persistent" $OUT/test_cuda.*.txt | sort | uniq -c | head -12
left 60 "1B F16" && { [ -f $H ] || $F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1; }
date +%T
for r in 1 2; do
  left 30 "round $r" || break
  echo "round $r plan: $(FERRY_CUDA_PERSIST=0 bt $H --device CUDA0)  persistent: $(FERRY_CUDA_PERSIST=1 bt $H --device CUDA0)"
done
date +%T

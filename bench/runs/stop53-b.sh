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
persist_tests 'Cuda.Persistent*' 120
echo "--- tg128: plan | default | all"
for r in 1 2; do echo "$(R=5 tg $H 128 FERRY_CUDA_PERSIST=0) | $(R=5 tg $H 128) | $(R=5 tg $H 128 FERRY_CUDA_PERSIST=1)"; done
echo "--- tg512: plan | default | all"
for r in 1 2; do left 40 "tg512 round $r" && echo "$(R=2 tg $H 512 FERRY_CUDA_PERSIST=0) | $(R=2 tg $H 512) | $(R=2 tg $H 512 FERRY_CUDA_PERSIST=1)"; done
echo "--- tg1024: plan | default | all"
left 40 "tg1024" && echo "$(R=1 tg $H 1024 FERRY_CUDA_PERSIST=0) | $(R=1 tg $H 1024) | $(R=1 tg $H 1024 FERRY_CUDA_PERSIST=1)"
date +%T

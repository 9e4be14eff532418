#!/usr/bin/env bash
# Stop 54, call C: after call A (H100: with the attention split over four blocks, tg512 and
# tg1024 well above the plan, but tg128 1,075 against 1,094 with one block a head), a head's
# attention stays one block below 128 keys and splits past them, and the step is the default
# for every graph it takes (up to 1,024 keys). The persistent tests, then 1B F16 tg128 /
# tg512 / tg1024: the plan (FERRY_CUDA_PERSIST=0) | the default | one block a head
# (FERRY_CUDA_PERSIST_SPLITS=1). Prediction: the default's tg128 as one block a head's
# (~1,094 on an H100), tg512 and tg1024 as call A's split (~1,060, ~1,012).
# .dev54: ferry.xz, test_cuda.xz (bench/build-for-device.sh). Carry [".dev54"].
BIN=${BIN:-.dev54} source bench/runs/common.sh
persist_tests 'Cuda.PersistentDecode*' 150
for n in 128 512 1024; do
  echo "--- tg$n: plan | default | one block a head"
  for r in 1 2; do left 40 "tg$n round $r" && echo "$(R=3 tg $H $n FERRY_CUDA_PERSIST=0) | $(R=3 tg $H $n) | $(R=3 tg $H $n FERRY_CUDA_PERSIST_SPLITS=1)"; done
done
date +%T

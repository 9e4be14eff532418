#!/usr/bin/env bash
# Stop 55, call A: stop 54's default (the persistent step over every graph it takes, its
# attention split past 128 keys, its logits stored into the session's read) on an H200, where
# the 1,330 t/s F16 tg128 target is set. Stop 53 measured 1,314 there with the copy; stop 54's
# store gained +1.7% on an H100. Prediction: tg128 ~1,330-1,340 on an H200 (an H100 gives
# ~1,090). The persistent tests, then 1B F16 tg128 plan | default (3 rounds), tg512 / tg1024
# (1 round), then 1B Q4_0 local | unix | tcp (served_rounds) when time is left.
# .dev54: ferry.xz, test_cuda.xz, fx.tar.xz (bench/build-for-device.sh). Carry [".dev54"].
BIN=${BIN:-.dev54} source bench/runs/common.sh
persist_tests 'Cuda.PersistentDecode*' 120
for n in 128 128 128 512 1024; do
  left 40 "tg$n" && echo "tg$n plan | default: $(R=5 tg $H $n FERRY_CUDA_PERSIST=0) | $(R=5 tg $H $n)"
done
date +%T
left 150 "served" || exit 0
gen_models
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 3
date +%T

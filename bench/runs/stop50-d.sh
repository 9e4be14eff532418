#!/usr/bin/env bash
# Stop 50, call D: stop 50-c's best (2 copies in flight a SM: H100 976.3 us against ferry's
# 1,034 and the floor's 787) again, with one word a lane polled, and with a lower cap while the
# consumers are in the chain (q/k/v, attention, wo: 50-c's table at 1 copy in flight had
# their reads ready in 1.5-2.3 us, at 2 in 4.1-5.9, but the big products then streamed less).
# Prediction: chain cap 1 with 2-3 elsewhere -3-5% against 2 everywhere; polling one word a
# lane within 1%. Then output off, 512 keys, the floor and ferry's F16 tg128, same card.
# .dev49: bench_cuda_persist.xz (this form, built at a0ef64c), bench_cuda_floor.xz, ferry.xz.
# Carry [".dev49"].
BIN=${BIN:-.dev49} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
P=/tmp/bench_cuda_persist
for args in "64 1 1 2" "64 1 0 2" "64 1 1 2 1" "64 1 1 3 1" "64 1 1 4 1" "64 1 1 3 2" \
  "64 0 1 2" "512 1 1 2"; do
  left 30 "$args" && { timeout 30 $P 50 16 $args | grep --line-buffered -v "^check.*(ok)$" || echo "(rc $?)"; }
done
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -16
date +%T
left 60 "ferry" && { gen_models; date +%T; echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"; }

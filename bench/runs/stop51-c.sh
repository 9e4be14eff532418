#!/usr/bin/env bash
# Stop 51, call C: two changes to the persistent prototype, each beside the form before it.
# 1. The attention's cached keys and values loaded into registers before its wait for q (11th
#    argument, default on; stop 51-b's table, H100: the attention phase 6.66 us a layer, up to
#    5.6 of it after its input: three dependent rounds of cache loads). Prediction: the
#    attention phase ~6.7 -> ~2.5 us, the step -4-7% (H100 ~860 us, H200 ~720).
# 2. The rest of the decode step's work (this commit's binary; 504a196's, without it, is
#    bench_cuda_persist_504): rmsnorm weights, q and k roped, the new key and value stored into
#    a cache a layer (F16), checked against the plain kernels. Prediction: within 1-2%.
# Then the floor and ferry's F16 tg128 on the same card.
# .dev51: bench_cuda_persist.xz, bench_cuda_persist_504.xz, bench_cuda_floor.xz, ferry.xz.
# Carry [".dev51"].
BIN=${BIN:-.dev51} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_persist_504 bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
FULL=1 persist 64 1 1 2 2 0 1 0 1
P=/tmp/bench_cuda_persist_504 persist 64 1 1 2 2 0 1 0 1
P=/tmp/bench_cuda_persist_504 persist 64 1 1 2 2 0 1 0 0
persist 64 1 1 2 2 0 1 0 0
persist 64 1 1 3 1 0 1 0 1
P=/tmp/bench_cuda_persist_504 persist 64 1 1 3 1 0 1 0 1
persist 64 1 1 2 2 0 2 0 1
persist 64 1 1 3 3 0 1 0 1
persist 64 1 1 2 1 0 1 0 1
persist 128 1 1 2 2 0 1 0 1
persist 128 1 1 2 2 0 1 0 0
persist 512 1 1 2 2 0 1 0 1
persist 64 0 1 2 2 0 1 0 1
date +%T
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -9
f16_tg128
persist 64 1 1 2 2 0 1 0 1
P=/tmp/bench_cuda_persist_504 persist 64 1 1 2 2 0 1 0 1
persist 64 1 1 3 1 0 1 0 1
date +%T

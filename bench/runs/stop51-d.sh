#!/usr/bin/env bash
# Stop 51, call D: the persistent prototype reading ferry's own layouts: q, k and v three
# matrices (a phase's tiles from one, then the next), gate and up two (a stage's 16 KiB from
# two 8 KiB copies, 2 rows of each), the caches a row a position with its 8 heads side by side
# (a head's keys 1 KiB apart, not 128 bytes). Beside a645364's binary (one matrix a product,
# the caches a head at a time), both with every change of calls A-C; then the floor and
# ferry's F16 tg128 on the same card.
# Prediction: within 1% of a645364's (the bytes are the same; a key row is still 128 bytes).
# .dev51: bench_cuda_persist.xz, bench_cuda_persist_645.xz, bench_cuda_floor.xz, ferry.xz.
# Carry [".dev51"].
BIN=${BIN:-.dev51} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_persist_645 bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
O=/tmp/bench_cuda_persist_645
FULL=1 persist 64 1 1 3 1 0 1
P=$O persist 64 1 1 3 1 0 1
persist 64 1 1 2 2 0 1
P=$O persist 64 1 1 2 2 0 1
for c in "3 2 0 1" "4 1 0 1" "4 2 0 1" "3 1 0 2" "2 1 0 1"; do persist 64 1 1 $c; done
persist 128 1 1 3 1 0 1
persist 64 0 1 3 1 0 1
date +%T
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -9
f16_tg128
persist 64 1 1 3 1 0 1
P=$O persist 64 1 1 3 1 0 1
persist 64 1 1 2 2 0 1
date +%T

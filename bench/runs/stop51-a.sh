#!/usr/bin/env bash
# Stop 51, call A: the persistent prototype's copies in flight on whatever card comes (stop 50-c,
# H100: 2 a SM 976.3 us against ferry's 1,034 and the floor's 787; never run on an H200, whose
# DRAM wants more bytes in flight), with three new knobs: a cap while a block's consumers wait
# for their input (8th argument: the hops' store and load wait behind the copies in flight,
# and all blocks wait at about the same time), a block's tiles consecutive (9th: a line of x
# stored by 1-2 blocks, not 4-16) and a sleep between polls (10th). Then stop 50-d's chain caps,
# the floor and ferry's F16 tg128, same card.
# Predictions: on an H200 3 copies beat 2 (~1-3%); the waiting cap of 1 with 4-6 elsewhere beats
# the best plain cap by 3-6% (the hops ~3-8 us -> ~2); contiguous tiles within 1%; backoff
# within 1% or slower.
# .dev51: bench_cuda_persist.xz (this form), bench_cuda_floor.xz, ferry.xz. Carry [".dev51"].
BIN=${BIN:-.dev51} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
FULL=1 persist 64 1 1 2
for f in 3 4 6; do persist 64 1 1 $f; done
# the chain caps (stop 50-d)
for c in "2 1" "3 1" "4 1" "3 2" "4 2" "6 2"; do persist 64 1 1 $c; done
# the waiting caps
for c in "2 2 1" "3 3 1" "4 4 1" "6 6 1" "13 13 1" "4 4 2" "6 6 2" "4 2 1" "6 2 1"; do
  persist 64 1 1 $c
done
# consecutive tiles, backoff, one word a lane
for c in "2 2 0 1" "3 3 0 1" "4 4 1 1" "2 2 0 0 200" "2 2 0 0 500" "4 4 1 0 200"; do
  persist 64 1 1 $c
done
persist 64 1 0 2
date +%T
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -16
f16_tg128
# the best-looking forms again, in full, output off and 512 keys
FULL=1 persist 64 1 1 4 4 1
FULL=1 persist 64 1 1 3
persist 64 0 1 2
persist 64 0 1 4 4 1
persist 512 1 1 2
persist 512 1 1 4 4 1
date +%T

#!/usr/bin/env bash
# Stop 51, call B: stop 51-a (H200) found a block's tiles consecutive worth 6% (2 copies in flight
# 816.0 -> 766.7 us, floor 553.8; ferry's own step on an H200 in stop 50-a 829). Here: those
# shares in whole lines of the words they store (9th argument 2), with the chain caps that won
# in 51-a (3 copies, 1-2 in the chain: 797-798 against 808), and two polls in flight a waiting
# warp (10th argument: the second that many ns after the first; down keeps one). Then the
# floor and ferry's F16 tg128 on the same card.
# Predictions: whole lines within 1% of consecutive; the chain caps with consecutive tiles -1-2%;
# two polls in flight -2-4% (a hop's ~3-5 us by ~0.5-1).
# .dev51: bench_cuda_persist.xz (this form), bench_cuda_floor.xz, ferry.xz. Carry [".dev51"].
BIN=${BIN:-.dev51} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
FULL=1 persist 64 1 1 2 2 0 1
FULL=1 persist 64 1 1 2 2 0 2
persist 64 1 1 3 3 0 2
for c in "3 1 0 1" "3 2 0 1" "4 2 0 1" "3 1 0 2" "3 2 0 2" "4 2 0 2" "4 1 0 2"; do persist 64 1 1 $c; done
for c in "2 2 0 1 300" "2 2 0 1 600" "2 2 0 1 1000" "2 2 0 2 300" "2 2 0 2 600" "3 2 0 2 600"; do
  persist 64 1 1 $c
done
for c in "3 3 1 2" "4 4 1 2" "4 2 1 2" "6 2 1 2"; do persist 64 1 1 $c; done
persist 64 1 1 2 2 0 0
date +%T
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -9
f16_tg128
FULL=1 persist 64 1 1 3 2 0 2 600
persist 64 0 1 2 2 0 2
persist 512 1 1 2 2 0 2
persist 64 1 1 2 2 0 1
persist 64 1 1 2 2 0 2
date +%T

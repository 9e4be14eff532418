#!/usr/bin/env bash
# Stop 50, call C: stop 50-b's tagged form (H100: 1,084-1,113 us, floor 787, ferry 1,035)
# with two changes. Down's four runs of input words read in one round (they were four rounds
# one after another: its input ready 8.5-11.8 us after gate/up's last store). And the
# producer's copies in flight capped (the 6th argument): the tables of 50-a and 50-b read
# every L2 access a consumer makes while its SM's copies are in flight as ~2-3 us, ~0.5 while
# the ring is full and none are, as if the reads queue behind the misses at L2 (132 SMs x 13 x
# 16 KiB is ~8 us of DRAM). Prediction: 2-4 copies in flight keep DRAM busy (~25 KB a SM cover
# its latency) and cut the inputs' ready times to ~1 us: the step -15-25% (H100 ~850-900 us,
# H200 ~600-650); 1 copy in flight slower. Then the floor and ferry's F16 tg128 on the same card.
# .dev49: bench_cuda_persist.xz (this form), bench_cuda_floor.xz, ferry.xz. Carry [".dev49"].
BIN=${BIN:-.dev49} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
for f in 13 3 2 4 6 1; do
  left 30 "in flight $f" && { timeout 30 /tmp/bench_cuda_persist 50 16 64 1 1 $f || echo "(rc $?)"; }
done
left 30 "512 keys" && { timeout 30 /tmp/bench_cuda_persist 50 16 512 1 1 3 || echo "(rc $?)"; }
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -16
date +%T
left 100 "ferry" && { gen_models; date +%T; echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"; }

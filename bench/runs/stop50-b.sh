#!/usr/bin/env bash
# Stop 50, call B: the persistent prototype with tagged activations (a reader waits on the
# values, no counter, fence or second round trip), the K = 2048 inputs shared by a block's
# warps through shared memory (one L2 read of x a block, not one a warp), tiles summed two at a
# time, wo's and down's x rows read before their tiles. Then the floor and ferry's own F16
# tg128 again on the same card.
# Prediction (stop 50-a on an H200: persistent 848.8 us, floor 553.4, ferry 829): the qkv and
# gate/up inputs 3.1 -> ~1 us, the rows 1.5-4.4 -> ~0.5-1 us, the small phases' tiles -30%;
# the persistent step ~680-740 us on an H200 (below ferry's 829 and the target's 752), ~900 on
# an H100; polling every word (poll all 1) slower than one word a lane by 1-5%.
# .dev49: bench_cuda_persist.xz (this form), bench_cuda_floor.xz, ferry.xz. Carry [".dev49"].
BIN=${BIN:-.dev49} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
timeout $(cap 60) /tmp/bench_cuda_persist 50 16 64 1 0 || echo "(rc $?)"
left 40 "poll all" && { timeout 40 /tmp/bench_cuda_persist 50 16 64 1 1 || echo "(rc $?)"; }
left 40 "output off" && { timeout 40 /tmp/bench_cuda_persist 50 16 64 0 0 || echo "(rc $?)"; }
left 40 "512 keys" && { timeout 40 /tmp/bench_cuda_persist 50 16 512 1 0 || echo "(rc $?)"; }
left 40 "floor" && timeout 40 /tmp/bench_cuda_floor f16 100 | head -16
date +%T
left 100 "ferry" && { gen_models; date +%T; echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"; }

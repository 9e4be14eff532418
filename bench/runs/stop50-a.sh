#!/usr/bin/env bash
# (Ran at 151fbb0, on an H200: bench/results/cuda.md, stop 50. The 5th argument has since changed meaning.)
# Stop 50, call A: stop 49-b (below, its binaries) with one more knob, run after its forms: the
# producer asks L2 for the next 8, 16 or 32 tiles of its sequence while its ring is full (up
# to 132 x 32 x 16 KiB = 69 MB ahead, beside the ring's 27 MB). Prediction: if the chain's
# waits are longer than the ring covers (stop 49-b's table: the producer stalled), asking L2
# cuts the step by up to the stalled time that L2 can hold, ~5-10%; if not, nothing.
# Stop 49, call B (written without a GPU, for the next session): the persistent prototype's
# phases cut down. Each warp reads its input slice straight from L2 into registers (rmsnorm's
# sum of squares per warp, no block barrier), gate/up stores silu(g) u itself (rows
# interleaved), the attention issues its key and value loads together, 13 stages (208 KiB),
# weights evict-first in L2 (as ferry's kernels read them; bench_cuda_floor's are not).
# A fourth form: persistent with the producer waiting for each phase's input, as the
# consumers do (copies ahead across phases off, all else the same).
# After its timed forms it prints a table of one stamped persistent step: each kind of
# phase's span, its wait for the phase before, input, tiles, rows+count, and the producer's
# lead and stalls. Then the floor and ferry's own F16 tg128 on the same card. First, under a
# second: bench_unix_doorbell on this host (what frames in shared memory would save a unix step).
# Prediction (H100; stop 49-a there: persistent 1,293 us, floor 787): the per-phase excess
# 6.4 us -> ~2-3 us, the persistent step ~900-1,000 us, still above the floor; on an H200
# ~650-750. Copies ahead across phases worth 10-20% of the persistent step (the fourth form
# that much slower). The table says what is left.
# .dev49: bench_cuda_persist.xz, bench_cuda_floor.xz (build/release), bench_unix_doorbell.xz
# (g++ -O2 -std=c++20 -Ibench -static-libstdc++ -static-libgcc, no -march=native), ferry.xz (bench/
# build-for-device.sh). Carry [".dev49"].
BIN=${BIN:-.dev49} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor bench_unix_doorbell
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
# A unix round trip through a polled socket against a shared-memory doorbell, on this host
# (bench/results/remote.md, stop 49: 3.2-3.7 us against 0.7 on the 2-core VM): unplaced, then
# pinned to cores 2 and 3, and to 2 and 12.
for c in "" "2 3" "2 12"; do timeout 20 /tmp/bench_unix_doorbell 1024 128 20000 $c | tail -3; done
timeout $(cap 60) /tmp/bench_cuda_persist 50 16 64 1 || echo "(rc $?)"
left 40 "output off" && { timeout 40 /tmp/bench_cuda_persist 50 16 64 0 || echo "(rc $?)"; }
left 40 "512 keys" && { timeout 40 /tmp/bench_cuda_persist 50 16 512 1 || echo "(rc $?)"; }
for n in 8 16 32; do left 30 "L2 ahead $n" && { timeout 30 /tmp/bench_cuda_persist 50 16 64 1 $n || echo "(rc $?)"; }; done
left 40 "floor" && timeout 40 /tmp/bench_cuda_floor f16 100
date +%T
left 200 "ferry" && { gen_models; date +%T; echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"; }

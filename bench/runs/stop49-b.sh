#!/usr/bin/env bash
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
# Its steps ran in stop 50 as bench/runs/stop50-a.sh, which is this script with one knob's runs
# added before the floor (on an H200: bench/results/cuda.md, stop 50).
exec bash "$(dirname "$0")/stop50-a.sh"

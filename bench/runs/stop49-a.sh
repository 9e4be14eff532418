#!/usr/bin/env bash
# Stop 49, call A: the persistent prototype again, its consumers now keeping their slice of the
# input in registers (stop 48-d's first run on an H100: 2,047 us a step, the consumers
# streaming ~1.6 TB/s through 8-way bank conflicts on the input). Prediction: the persistent
# form's consumers no longer the bound; the step ~700-800 us on an H100 (the floor there, PDL
# load-then-wait: 787 us), below its per-product forms. Then ferry's F16 tg128 with each step's
# time stamped (stop 48-d's ferry step ran past the call's limit without a line).
# Carry [".dev29"].
export BIN=${BIN:-.dev29}
source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
timeout $(cap 60) /tmp/bench_cuda_persist 50 16 64 1 || echo "(rc $?)"
left 40 "output off" && { timeout 40 /tmp/bench_cuda_persist 50 16 64 0 || echo "(rc $?)"; }
left 40 "floor" && timeout 40 /tmp/bench_cuda_floor f16 100
date +%T; left 200 "ferry" && {
  gen_models; date +%T; ls -la $H
  timeout 100 $F bench -m $H --device CUDA0 -p 0 -n 128 -r 3 2>&1 | tail -5; date +%T
}

#!/usr/bin/env bash
# Stop 48, call D (written without a GPU; for the next session, on an H200 if one comes): the
# persistent-kernel prototype (bench/bench_cuda_persist.cu) beside the floor of today's
# structure (bench_cuda_floor) and ferry's own 1B F16 tg128 on the same card. Its first run is
# also its first test: it checks each of its forms against plain kernels (nmse of x and the
# logits) and exits 1 if one differs. Prediction, if the producer keeps DRAM busy through the
# chain: the persistent form's F16 step ~600-700 us on an H200 (3.5-4.1 TB/s), the same code
# a launch a product (with PDL) ~750-850 us, like ferry's ~837.
# .dev29: bench_cuda_persist, bench_cuda_floor (build/release/bin, xz) and ferry.xz. Carry
# [".dev29"].
BIN=${BIN:-.dev29} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
timeout $(cap 120) /tmp/bench_cuda_persist 50 16 64 1 || echo "(rc $?)"
left 60 "variants" && {
  timeout 60 /tmp/bench_cuda_persist 50 16 64 0
  timeout 60 /tmp/bench_cuda_persist 50 16 128 1
}
left 60 "floor" && timeout 60 /tmp/bench_cuda_floor f16 100
left 90 "ferry" && { gen_models; echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"; }

#!/usr/bin/env bash
# Stop 48, call A: HEAD's build (c217a21: 8562fe8's refactored GPU tests had only compiled;
# stripe lanes in the step trace) with the tiny-llama fixtures but q4_1 and q5_k_m (the carry's
# limit): the whole of test_cuda, test-ops, then 1B tg128 (F16, BF16, Q4_0), Q4_0 served side by
# side (local | unix | tcp), four rounds, and a tcp client's step trace with its lanes.
# Carry [".dev27"].
# Not run in stop 48 (no device time came for it): build .dev27 with bench/build-for-device.sh
# (xz ferry and test_cuda, copy the fixtures as fx.tar.xz, as common.sh says) and run it.
BIN=${BIN:-.dev27} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
tests "*" $(cap 240)
left 60 "test-ops" && { timeout $(cap 90) $F test-ops --backend CUDA0 2>&1 | tail -n 2; }
gen_models
gen_types bf16
local_rounds 3
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 4
left 40 "step trace" && tcp_step_trace

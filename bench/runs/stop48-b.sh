#!/usr/bin/env bash
# Stop 48, call B (meant for an H200: the F16 target's card; no H200 figure since stop 43):
# HEAD's build (c217a21) and a FERRY_CUDA_TRACE build of the same kernels (4b4f5d4): 1B tg128
# F16 | BF16 | Q4_0, three rounds; the per-kernel timeline of one F16 and one Q4_0 decode step
# (bench/tools/trace-timeline.py), F16 with the bulk form's knobs at other values (slots 4, 3
# or 1 issued before the wait) and gate/up's eighth asked for in L2 (as on an H100); Q4_0
# served side by side (local | unix | tcp), four rounds; a tcp client's step trace with its
# stripe lanes. No tests (no fixtures carried).
# Carry [".dev27b"] (ferry.xz, ferry-trace.xz).
# Not run in stop 48 (no H200 came): .dev27b holds ferry.xz and the trace build's ferry as
# ferry-trace.xz (CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace bench/build-for-device.sh).
BIN=${BIN:-.dev27b} source bench/runs/common.sh
mkdir -p /tmp/tb && cp $BIN/ferry-trace.xz /tmp/tb/ferry.xz
TRACE_BIN=/tmp/tb
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gen_models
gen_types bf16
local_rounds 3
hb() { (export "$@"; bt $H --device CUDA0); }
echo "--- F16 tg128: default | BULK_Q=4 | BULK_PRE=3 | BULK_PRE=1 | L2_NEXT=-1"
for r in 1 2; do
  left 40 "knob round $r" || break
  echo "$(bt $H --device CUDA0) | $(hb FERRY_CUDA_MV_BULK_Q=4) | $(hb FERRY_CUDA_MV_BULK_PRE=3) | $(hb FERRY_CUDA_MV_BULK_PRE=1) | $(hb FERRY_CUDA_L2_NEXT=-1)"
done
left 60 "F16 timeline" && timeline f16
left 60 "Q4_0 timeline" && TL_MODEL=$Q timeline q4_0
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 4
left 40 "step trace" && tcp_step_trace

#!/usr/bin/env bash
# Stop 42, call B: the per-kernel timeline of one decode step of main (a FERRY_CUDA_TRACE build
# in .devT), 1B F16 and Q4_0, for where the q/k/v -> attention -> wo island's time goes.
# Carry [".devT"].
BIN=.devT source bench/runs/common.sh
TRACE_BIN=.devT
gen_models
timeline f16
TL_MODEL=$Q timeline q4_0
echo "=== $(date -u +%T) done at ${SECONDS}s"

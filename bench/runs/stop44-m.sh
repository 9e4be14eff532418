#!/usr/bin/env bash
# Stop 44, call M: main (ad5e6f9's binaries, .dev16) on whatever card comes for `nvidia-h200`:
# `ferry devices` (the peak that decides the L2 ask: off at >= 4 TB/s), the early-attention
# test (form 4, the device's default: no ask on an H200), and `ferry bench -p 512 -n 128 -r 5`
# of the 1B F16 and Q4_0 files. Carry [".dev16"].
BIN=.dev16 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
$F devices 2>&1 | grep CUDA
gen_models
tests "*EarlyAttention*" $(cap 60)
grep "form 4" $OUT/test_cuda.stop44-m.1.txt
for m in $H $Q; do $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128"; done
echo "=== $(date -u +%T) done at ${SECONDS}s"

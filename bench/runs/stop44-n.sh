#!/usr/bin/env bash
# Stop 44, call N (review): f0f9d1f's early_rows on the file's overlaps(): the early-attention
# tests (every form, the indices' readiness counted), replay and fusion safety, the f16 oracle.
# Carry [".dev19"].
BIN=.dev19 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*EarlyAttention*:*Replayed*:*InPlace*:*FusedKernelsNever*:*LongDecode*:*CudaOracle*/f16" $(cap 150)
grep "form [24]" $OUT/test_cuda.stop44-n.1.txt

#!/usr/bin/env bash
# Run G (stop 27): the streaming form's launches without a folded norm (wo, down) in one
# 16-warp block per SM (FERRY_CUDA_MV_STREAM_WIDE=1) against two 8-warp blocks, side by side;
# its test first. The prediction (run B's timeline: Q4_0 down's prologue 3.65 us against 2.14 of
# rows, every block loading and quantizing the whole 32 KiB of b): b once per SM instead of
# twice shortens wo and down, ~1-2 us a layer. Carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: wide stream blocks, stream products"
timeout 150 $TC --gtest_filter='*WideStream*:*StreamProducts*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|OK \]" $OUT/test_cuda.txt | head -30
wait
echo "=== $(date -u +%T) tg128: default | WIDE=1"
for m in $Q $H; do
  echo "$(basename $m)"
  for r in 1 2 3; do echo "  $(tg $m 128) | $(tg $m 128 FERRY_CUDA_MV_STREAM_WIDE=1)"; done
done
echo "=== $(date -u +%T) done"

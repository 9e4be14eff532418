#!/usr/bin/env bash
# Run D (stop 29): run C with one prefetch.global.L2 per 128-byte line instead of bulk
# prefetches (which kept each attention block ~60 us past its work): the early attention asks
# L2 for the first FERRY_CUDA_ATTN_L2_MB MiB of the next gate and up weights (half from each)
# before its wait; tg128 for 0 (the default), 4, 8, 16 and 24, two rounds side by side, then
# the timeline at 16. .devF as in run A; carry [".devF"].
BIN=.devF
source bench/runs/common.sh
unpack ferry-trace
gen_models &
echo "=== $(date -u +%T) test_cuda, early attention with the prefetch"
FERRY_CUDA_ATTN_L2_MB=16 timeout 120 $TC --gtest_filter='Cuda.EarlyAttention*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|early" $OUT/test_cuda.txt | head
wait
echo "=== $(date -u +%T) tg128 for FERRY_CUDA_ATTN_L2_MB = 0 4 8 16 24"
for r in 1 2; do
  for m in $Q $H; do
    line="$(basename $m .gguf):"
    for mb in 0 4 8 16 24; do line="$line $(tg $m 128 FERRY_CUDA_ATTN_L2_MB=$mb) |"; done
    echo "$line"
  done
done
for m in $Q $H; do
  b=$(basename $m .gguf)-l2
  echo "=== $(date -u +%T) trace $b"
  FERRY_CUDA_ATTN_L2_MB=16 FERRY_CUDA_TRACE_OUT=$OUT/trace-$b.bin /tmp/ferry-trace bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
  python3 bench/tools/trace-timeline.py $OUT/trace-$b.bin > $OUT/timeline-$b.txt 2>&1
  rm -f $OUT/trace-$b.bin $OUT/trace-$b.bin.attn
  grep -A9 "^per kind" $OUT/timeline-$b.txt; grep "^step" $OUT/timeline-$b.txt
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run B (stop 29): run A's early attention with the written rows' indices read before the wait
# too (checked again after it), so that one L2 round trip follows the wait: its bitwise test,
# tg128 / tg512 side by side with FERRY_CUDA_ATTN_EARLY=0, and the timeline of the early form.
# .devF as in run A; carry [".devF"].
BIN=.devF
source bench/runs/common.sh
unpack ferry-trace
gen_models &
echo "=== $(date -u +%T) test_cuda (attention, replay, the carried fixtures)"
timeout 300 $TC --gtest_filter='Cuda.EarlyAttention*:Cuda.Chunked*:Cuda.LongDecode*:Cuda.SameLogits*:*CudaOracle.*/f16:*CudaOracle.*/q4_0:*CudaOracle.*/q8_0:*CudaOracle.*/q4_k_m:Cuda.InPlace*:Cuda.Replayed*:Cuda.Alternating*:Cuda.OutOfRange*:Cuda.Staged*' \
  > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|early" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) tg128 / tg512, early off | on"
for r in 1 2 3; do
  echo "f16: $(tg $H 128 FERRY_CUDA_ATTN_EARLY=0) | $(tg $H 128)   q4_0: $(tg $Q 128 FERRY_CUDA_ATTN_EARLY=0) | $(tg $Q 128)"
done
R=3
echo "tg512 f16: $(tg $H 512 FERRY_CUDA_ATTN_EARLY=0) | $(tg $H 512)   q4_0: $(tg $Q 512 FERRY_CUDA_ATTN_EARLY=0) | $(tg $Q 512)"
for m in $Q $H; do
  b=$(basename $m .gguf)-e1
  echo "=== $(date -u +%T) trace $b"
  FERRY_CUDA_TRACE_OUT=$OUT/trace-$b.bin /tmp/ferry-trace bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
  python3 bench/tools/trace-timeline.py $OUT/trace-$b.bin > $OUT/timeline-$b.txt 2>&1
  rm -f $OUT/trace-$b.bin $OUT/trace-$b.bin.attn
  grep -A9 "^per kind" $OUT/timeline-$b.txt; grep "^step" $OUT/timeline-$b.txt
done
echo "=== $(date -u +%T) done"

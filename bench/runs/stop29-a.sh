#!/usr/bin/env bash
# Run A (stop 29): decode attention loading the cache's rows before griddepcontrol.wait
# (k_attn_row's early form, FERRY_CUDA_ATTN_EARLY): its bitwise test and the tests around the
# attention and graph replay; tg128 / tg512 side by side with it off; and the timeline of both
# from a FERRY_CUDA_TRACE build whose attention kernel now appends records too.
# .devF holds ferry.xz, test_cuda.xz, ferry-trace.xz and fx.tar.xz (the f16, q4_0, q8_0 and
# q4_k_m fixtures); carry [".devF"].
BIN=.devF
source bench/runs/common.sh
unpack ferry-trace
gen_models &
echo "=== $(date -u +%T) test_cuda (attention, replay, the carried fixtures)"
timeout 300 $TC --gtest_filter='Cuda.EarlyAttention*:Cuda.Chunked*:Cuda.LongDecode*:Cuda.SameLogits*:*CudaOracle.*/f16:*CudaOracle.*/q4_0:*CudaOracle.*/q8_0:*CudaOracle.*/q4_k_m:Cuda.EveryOp*:Cuda.InPlace*:Cuda.Replayed*:Cuda.Alternating*:Cuda.WideStream*:Cuda.OutOfRange*:Cuda.Staged*' \
  > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED|\[ cuda|early" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) tg128 / tg512, early off | on"
for r in 1 2 3; do
  echo "f16: $(tg $H 128 FERRY_CUDA_ATTN_EARLY=0) | $(tg $H 128)   q4_0: $(tg $Q 128 FERRY_CUDA_ATTN_EARLY=0) | $(tg $Q 128)"
done
R=3
echo "tg512 f16: $(tg $H 512 FERRY_CUDA_ATTN_EARLY=0) | $(tg $H 512)   q4_0: $(tg $Q 512 FERRY_CUDA_ATTN_EARLY=0) | $(tg $Q 512)"
for e in 0 1; do
  for m in $Q $H; do
    b=$(basename $m .gguf)-e$e
    echo "=== $(date -u +%T) trace $b"
    FERRY_CUDA_ATTN_EARLY=$e FERRY_CUDA_TRACE_OUT=$OUT/trace-$b.bin /tmp/ferry-trace bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 | grep tg64
    python3 bench/tools/trace-timeline.py $OUT/trace-$b.bin > $OUT/timeline-$b.txt 2>&1
    rm -f $OUT/trace-$b.bin $OUT/trace-$b.bin.attn
    grep -A9 "^per kind" $OUT/timeline-$b.txt; grep "^step" $OUT/timeline-$b.txt
  done
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 61, call A (any card). Carry [".dev59d", ".dev61"]: main at 15633df (stop60-a's binary,
# whose CUDA code was main's until this stop) and .dev61, main with the chain's copies in flight
# capped part by part (FERRY_CUDA_PERSIST_INFLIGHT=A,Q,T,I,W: in q/k/v, in a block's attention
# split, while a block waits for wo's input, in wo) and the per-phase stamps
# (FERRY_CUDA_PERSIST_STAMPS=1, on branch persist-quant until now), with its test_cuda.
# The chain sweep asks where the queue that sets the hops sits (stop 59: copies in flight
# lengthen every hop, by Little's law over the whole card's stream). At tg128 the attention runs
# in 32 of the 132 blocks; the other 100 wait for wo's input with one copy in flight each (their
# rings fill at one copy's pace while the attention lasts). If the queue is each SM's own, the
# waiting blocks can keep 2-3 copies in flight (I) without slowing the attention's loads and
# polls: prediction +1-3% for 3,1,1,3,1 against 3,1. If it is the card's (one queue in front of
# every request), I=3 slows the attention and the hop after it by more than the stream gains:
# slower. Q and W at 2 (q/k/v's and wo's own streams against their hops) test the other parts.
# The output sweep (O: the output phase's copies in flight, 3 as before by default): the output
# streams 525 MB a token with no hop after it. On an H100 it reached 3.3 TB/s at 3 copies (stop
# 59: 159 us), the card's peak. On an H200, 3 copies a block are 6.5 MB in flight: the ~4.6 TB/s
# it can stream needs them back in 1.4 us, which the H100's loaded 2 us would miss. Prediction:
# on an H200, O = 5 or 8 is faster by up to ~15 us a token (+2%) if 3 leaves the output short of
# the peak (the stamps' output span: 525 MB over it); on an H100, within the spread.
# On an H200: stop60-a's steps (the F16 target first, with this stop's main beside it), the
# chain sweep after its sweep, then the stamps (main's own now: the default, 4,1 and
# 3,1,1,3,1; since this stop they also split the attention into its hop from q/k/v and its
# sums, and give each product's producer the shares of its span spent waiting for a free stage
# and under the cap), then the new test. On an H100:
# stop60-a's binary beside this stop's main, the chain sweep, the stamps and the new test only
# (stop 59's H100 figures are the baseline; the device time is kept for another try at an H200).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
BIN=${BIN:-.dev59d}
# (A checkout without stop60-a's binary runs this stop's in its place: the side-by-side columns
# then compare one build with itself. .dev61: bench/build-for-device.sh .dev61, then xz -T2 -6
# .dev61/ferry .dev61/test_cuda, at this stop's code or any later one with the same CUDA code.)
[ -f $BIN/ferry.xz ] || { echo "($BIN missing: ${CBIN:-.dev61} in its place)"; BIN=${CBIN:-.dev61}; }
BIN=$BIN source bench/runs/common.sh
CBIN=${CBIN:-.dev61}
date +%T
unxz_bin $CBIN/ferry.xz /tmp/ferry61
unxz_bin $CBIN/test_cuda.xz /tmp/test_cuda61
gen_models
CHAIN="3,1,1,3,1 3,1,1,2,1 3,2,1,1,1 3,3,1,1,1 3,1,1,1,2 3,1,2,1,1"
OUTPUT="3,1,1,1,1,2 3,1,1,1,1,5 3,1,1,1,1,8"
chain_tests() {
  left 60 "the chain's tests" &&
    F=/tmp/ferry61 TC=/tmp/test_cuda61 tests \
      "Cuda.PersistentDecodeCopiesInFlightAndStampsChangeNoBits:Cuda.PersistentDecodeMatchesTheKernelPlan" \
      $(cap 150)
}
if [[ $CARD == *H200* ]]; then
  # The F16 target: the plan | stop60-a's binary | this stop's main (its stamps' checks compiled
  # in, off), side by side.
  tg_rounds 3 "plan | default (.dev59d) | default (.dev61)" FERRY_CUDA_PERSIST=0 "" F=/tmp/ferry61
  sweep_rounds 2 FERRY_CUDA_PERSIST_INFLIGHT 4,1 5,1 4,2 2,1
  echo "(.dev61:)"
  F=/tmp/ferry61 sweep_rounds 2 FERRY_CUDA_PERSIST_INFLIGHT $CHAIN
  F=/tmp/ferry61 sweep_rounds 2 FERRY_CUDA_PERSIST_INFLIGHT $OUTPUT
  bench_tables 5 $H $Q
  servers_start
  served_rounds 3
  test_ops
  BIN=$CBIN F=/tmp/ferry61 stamps base
  BIN=$CBIN F=/tmp/ferry61 stamps in41 FERRY_CUDA_PERSIST_INFLIGHT=4,1
  BIN=$CBIN F=/tmp/ferry61 stamps i3 FERRY_CUDA_PERSIST_INFLIGHT=3,1,1,3,1
  chain_tests
else
  tg_rounds 2 "default (.dev59d) | default (.dev61)" "" F=/tmp/ferry61
  echo "(.dev61:)"
  F=/tmp/ferry61 sweep_rounds 3 FERRY_CUDA_PERSIST_INFLIGHT $CHAIN
  F=/tmp/ferry61 sweep_rounds 2 FERRY_CUDA_PERSIST_INFLIGHT $OUTPUT
  BIN=$CBIN F=/tmp/ferry61 stamps base
  BIN=$CBIN F=/tmp/ferry61 stamps i3 FERRY_CUDA_PERSIST_INFLIGHT=3,1,1,3,1
  chain_tests
fi
date +%T

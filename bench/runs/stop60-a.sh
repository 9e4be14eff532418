#!/usr/bin/env bash
# Stop 60, call A (any card). Binaries (carry [".dev59d", ".dev59b"]): .dev59d/ferry.xz, main's
# build at 15633df (main's code since differs in `ferry bench`'s internals and the run scripts
# only); .dev59b/ferry.xz, branch persist-quant's build with the stamps
# (FERRY_CUDA_PERSIST_STAMPS=1, summed up by .dev59b/persist-stamps.py).
# On an H200 (none since stop 53): the F16 target, plan | default, three rounds (prediction
# ~1,335: stop 53's 1,314 x1.017 for the logits' store). Then the copies in flight a block, never
# run on an H200: stop 59's H100 stamps made the hops the weights' stream's queue (Little's law);
# the H200 streams ~1.4x faster, so the same bytes in flight queue ~1.4x shorter and may not
# fill its stream. Prediction: 4,1 at least as fast as 3,1 there (on an H100 it was 1.6% slower).
# Then bench tables with memory and bandwidth, the served rounds, test-ops and last the stamps
# (where an H200's layer goes, never measured). LIMIT=S ends the steps sooner (a call with
# less device time left).
# On an H100: the same steps but the sweep and the stamps (main's run-script helpers of
# 75a3139 had not run on a device).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
BIN=${BIN:-.dev59d} source bench/runs/common.sh
SBIN=${SBIN:-.dev59b}
date +%T
gen_models
if [[ $CARD == *H200* ]]; then
  plan_rounds 3
  sweep_rounds 2 FERRY_CUDA_PERSIST_INFLIGHT 4,1 5,1 4,2 2,1
  bench_tables 5 $H $Q
else
  plan_rounds 2
  bench_tables 3 $H $Q
fi
servers_start
served_rounds 3
test_ops
if [[ $CARD == *H200* ]]; then
  unxz_bin $SBIN/ferry.xz /tmp/ferry-s
  BIN=$SBIN F=/tmp/ferry-s stamps base
  BIN=$SBIN F=/tmp/ferry-s stamps in41 FERRY_CUDA_PERSIST_INFLIGHT=4,1
fi
date +%T

#!/usr/bin/env bash
# Run A of stop 40: why the chained products are slower. Stop 40's first run (H100, stop39-a.sh)
# launched the chain for the first time: 1B F16 tg128 924.8 -> 782.3 t/s with FERRY_CUDA_CHAIN=1
# (bulk form), 583 with the register form, Q4_0 1,631.8 -> 908.9 (register form). Here, from a
# FERRY_CUDA_TRACE build of head (CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace
# bash bench/build-for-device.sh /tmp/devT; xz into .devT/ferry.xz; carry [".devT"]):
#  1. the per-kernel timeline (bench/tools/trace-timeline.py) of 1B F16 and Q4_0 decode, chain
#     off and on: each stage's wait at its barrier, its prologue and its rows against the
#     unchained launch's;
#  2. ncu on a few launches of k_mv_chain and of the unchained kernels (DRAM throughput, local
#     memory traffic: the register form's spills), when ncu may read the counters.
# Prediction: the rows of a chained stage take longer than the same product unchained (the
# register form's spills in F16/Q4_0; the bulk form's barrier waits ~2-4 us each in F16).
# (Run on the binaries of 111a138: the chain and FERRY_CUDA_CHAIN are gone since 3d8bb59, so
# on a later build its chained timelines are the unchained ones; results: bench/results/cuda.md.)
BIN=${BIN:-.devT}
source bench/runs/common.sh
gen_models
timeline() { # MODEL NAME [FERRY_*=V ...]
  local m=$1 name=$2
  shift 2
  echo "=== $(date -u +%T) trace $name"
  env "$@" FERRY_CUDA_TRACE_OUT=$OUT/trace.bin $F bench -m $m --device CUDA0 -p 0 -n 64 -r 1 2>&1 |
    grep tg64
  python3 bench/tools/trace-timeline.py $OUT/trace.bin > "$OUT/timeline-$name.txt" 2>&1
  rm -f $OUT/trace.bin*
  grep -A12 "^per kind" "$OUT/timeline-$name.txt"
  grep "^step" "$OUT/timeline-$name.txt"
}
timeline $H f16
timeline $H f16-chain FERRY_CUDA_CHAIN=1
timeline $Q q4_0
timeline $Q q4_0-chain FERRY_CUDA_CHAIN=1
timeline $H f16-chain-reg FERRY_CUDA_CHAIN=1 FERRY_CUDA_MV_BULK=0
N=/usr/local/cuda/bin/ncu
nc() { # NAME KERNEL-REGEX MODEL [FERRY_*=V ...]
  local name=$1 k=$2 m=$3
  shift 3
  left 60 "ncu $name" || return
  echo "=== $(date -u +%T) ncu $name"
  env "$@" timeout $(cap 90) $N --kernel-name regex:$k --launch-skip 40 --launch-count 4 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    --metrics l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes_read.sum,gpu__time_duration.sum \
    $F bench -m $m --device CUDA0 -p 0 -n 16 -r 1 > $OUT/ncu-$name.txt 2>&1
  echo "rc $?"
  grep -E "k_mv|Duration|DRAM Throughput|Memory Throughput|local_op|dram__bytes|Registers Per|Achieved Occ|Block Limit|Grid Size|==ERR|==WARN" $OUT/ncu-$name.txt | head -60
}
nc f16-chain k_mv_chain $H FERRY_CUDA_CHAIN=1
nc q4_0-chain k_mv_chain $Q FERRY_CUDA_CHAIN=1
nc q4_0 k_mv_stream $Q
nc f16 k_mv_bulk $H
echo "=== $(date -u +%T) done at ${SECONDS}s"

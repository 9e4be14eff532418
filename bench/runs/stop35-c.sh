#!/usr/bin/env bash
# Run C (stop 35): stop 33's bulk form (bench/runs/stop33-bulk.patch) applied to main, on by
# default for F16/BF16 with S = 2 slots a warp and two blocks per SM (its best shape in stop
# 34: 1B F16 tg128 median 1,163 against 1,110); Q4_0/Q6_K keep the register form.
#  1. test_cuda: the bulk form against the register form (products, f16 and q4_0 decode), the
#     streaming-form tests with the register form asked for, progressive results (the mirror
#     of either form), SameLogits, fused against unfused decode, the f16 / q4_0 / q8_0 oracle
#     cases, the op suite; then the served tests.
#  2. tg128 side by side, F16 four rounds and Q4_0 three: HEAD (6364a92) | this build |
#     this build with FERRY_CUDA_MV_BULK=0 (the register form).
#     F16 also: S = 3, S = 3 with b from global memory, S = 4 with it (two blocks an SM where
#     they fit: stop 34 measured S = 3 and 4 only with one block).
#  3. 1B F16 served (unix, tcp) with the new default, two rounds.
# Prediction: F16 +3-6% over HEAD; Q4_0 and BULK=0 within noise of HEAD.
# .devB holds ferry.xz, ferry0.xz (HEAD), test_cuda.xz and fx.tar.xz; carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
unpack ferry0
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*Bulk*:*Stream*:*Progressive*:*SameLogits*:*FusedDecode*:*CudaOracle*/f16:*CudaOracle*/q4_0:*CudaOracle*/q8_0:*EveryOp*}" 300
wait
for m in $H $Q; do
  echo "=== $(date -u +%T) $(basename $m) tg128: HEAD | bulk default | MV_BULK=0" \
    "[F16: | S=3 | S=3 XGLOBAL | S=4 XGLOBAL, two blocks an SM where they fit]"
  bt $m --device CUDA0 > /dev/null
  rounds=3
  [ $m = $H ] && rounds=4
  for r in $(seq $rounds); do
    row="$(F=/tmp/ferry0 bt $m --device CUDA0) $(bt $m --device CUDA0)"
    row="$row $(FERRY_CUDA_MV_BULK=0 bt $m --device CUDA0)"
    if [ $m = $H ]; then
      row="$row $(FERRY_CUDA_MV_BULK=3 bt $m --device CUDA0)"
      row="$row $(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_XGLOBAL=1 bt $m --device CUDA0)"
      row="$row $(FERRY_CUDA_MV_BULK=4 FERRY_CUDA_MV_BULK_XGLOBAL=1 bt $m --device CUDA0)"
    fi
    echo "$row"
  done
done
echo "=== $(date -u +%T) 1B F16 served: local | unix | tcp"
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
for r in 1 2; do
  echo "$(bt $H --device CUDA0) $(bt $H --remote unix:$SD/u) $(bt $H --remote tcp:127.0.0.1:$P)"
done
echo "=== $(date -u +%T) test_cuda: served"
tests "*Served*" 200
echo "=== $(date -u +%T) done"

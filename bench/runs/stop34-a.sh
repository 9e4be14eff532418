#!/usr/bin/env bash
# (stop33-bulk.patch landed in stop 35, commit e1936d9: the bulk form is main's, on by default for
# F16/BF16. The patch itself: `git show ed37fd5:bench/runs/stop33-bulk.patch`.)
# Run A of stop 34 (ran 2026-12-05 01:46 UTC; results in bench/results/cuda.md, "stop 34"): the
# TOP_K kernel (src/backends/cuda/ops/top-k.cu), then offered only with FERRY_CUDA_TOPK=1; it
# passed and is on by default since 8e68d96.
#  1. test_cuda: TopKMatchesTheCpuOnHardRows (ties, NaN, -0, 128,256-wide rows, k 1-1024)
#     and the op suite (its five TOP_K cases; test_cuda sets FERRY_CUDA_TOPK=1 itself).
#  2. `ferry test-ops --backend CUDA0` with FERRY_CUDA_TOPK=1: the TOP_K lines and the summary.
#  3. Sampled generation, `ferry run -n 256` on 1B Q4_0 (llama.cpp's default sampler, and
#     greedy), tokens/s, three rounds: locally and through `ferry serve` over unix and tcp,
#     reading whole rows (FERRY_DEVICE_TOPK=0; also what a session does where the device
#     declines TOP_K, i.e. CUDA without FERRY_CUDA_TOPK=1) or candidates from the GPU kernel
#     (FERRY_CUDA_TOPK=1 on the client for local runs, on the server for served ones).
# Prediction (before any run): the kernel ~5-10 us a token (two launches: 32 blocks of 4,096
# values, then 1,280 candidates); local generation +2-5% over whole rows (the 513 KB copy and
# the ~10 us host selection go), tcp +10-20% (the row's transfer over loopback, ~100-150 us of
# a ~0.8 ms token), unix +2-5%.
# Binaries: .devA (ferry.xz, test_cuda.xz, fx.tar.xz) built from main at or after 3da46bb
# (with bench/runs/stop33-bulk.patch and stop32-unix-pieces.patch applied, both off by default);
# carry [".devA"].
BIN=${BIN:-.devA}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: TOP_K rows, the op suite"
tests "*TopK*:*EveryOp*" 240
echo "=== $(date -u +%T) test-ops CUDA0 (FERRY_CUDA_TOPK=1)"
FERRY_CUDA_TOPK=1 $F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
grep -E "TOP_K" $OUT/test-ops.txt
tail -1 $OUT/test-ops.txt
wait
serve_unix FERRY_CUDA_TOPK=1
serve_tcp 0 FERRY_CUDA_TOPK=1
echo "servers listening: $(servers_up)"
gen() { # LABEL ENV... -- ARGS...: the generated tokens/s of `ferry run -n 256`
  local label=$1 envs=()
  shift
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "$label $(env "${envs[@]}" $F run -m $Q -n 256 "$@" 2>&1 > /dev/null |
    sed -n 's/.*generated .* (\([0-9.]*\) tokens\/s).*/\1/p')"
}
for r in 1 2 3; do
  for s in "" "--temp 0"; do
    echo "--- round $r sampler: ${s:-default}"
    gen "local rows" FERRY_DEVICE_TOPK=0 -- --device CUDA0 $s
    gen "local candidates" FERRY_CUDA_TOPK=1 -- --device CUDA0 $s
    gen "unix rows" FERRY_DEVICE_TOPK=0 -- --remote unix:$SD/u $s
    gen "unix candidates" X=1 -- --remote unix:$SD/u $s
    gen "tcp rows" FERRY_DEVICE_TOPK=0 -- --remote tcp:127.0.0.1:$P $s
    gen "tcp candidates" X=1 -- --remote tcp:127.0.0.1:$P $s
  done
done
echo "=== $(date -u +%T) done"

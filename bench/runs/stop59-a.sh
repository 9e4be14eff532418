#!/usr/bin/env bash
# Stop 59, call A (any card). Binaries (carry [".dev59"]):
# - .dev59/ferry.xz, test_cuda.xz: branch poll-main (main + FERRY_CUDA_PERSIST_POLL: 1, the
#   default, a wait for runs of words polls each run's last word first; 0, every word each round,
#   as main before it);
# - .dev59/ferry-s.xz: branch persist-quant with FERRY_CUDA_PERSIST_SENTINEL's bits (1: down's
#   input waited for on one word a lane; 2: after a round finds a word missing, that word alone
#   polled; 4: every run's last word first, as poll 1) and the stamps
#   (FERRY_CUDA_PERSIST_STAMPS=1), summed up by .dev59/persist-stamps.py;
# - .dev59/fx/tiny-llama-f16.gguf: the model the persistent step's tests read. (Call A's tests
#   stopped at once: the oracle reads fx's reference.json and case*.logits.f32 as well; a rerun
#   carries those small files in .dev59/fx too.)
# Stop 58 call C's stamps (H100) put 11-13 us of every 1B layer in the hops between phases,
# 4.2 us (F16) before down, where every warp of 132 blocks polls 8 KB a round (~8.6 MB of L2
# reads a round across the card, beside the weights' stream through the same L2). Prediction:
# poll 1 (sentinel 4) shortens that hop by ~1-2 us a layer and the others a little, F16 tg128
# +2-4%; sentinel 1 less (one word of the lane's four runs).
# On an H200: the F16 target first (plan | poll 1 | poll 0, three rounds; prediction ~1,335
# with poll 0), stop 57's copies-in-flight sweep (never run on an H200), the stamps, bench
# tables, test-ops, served rounds, the persistent step's tests. On an H100: the persistent
# step's tests, the poll and sentinel rounds, the copies in flight with poll 1, the stamps.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
BIN=${BIN:-.dev59} source bench/runs/common.sh
unxz_bin $BIN/ferry-s.xz /tmp/ferry-s
S() { F=/tmp/ferry-s tg "$@"; }
date +%T
gen_models
poll_rounds() { # N
  local r
  echo "--- 1B F16 tg128 (-p 0 -r 5): poll 0 | poll 1 | branch sentinel 0 | 1 | 3 | 4"
  for r in $(seq $1); do
    left 60 "poll round $r" || break
    local row="$(tg $H 128 FERRY_CUDA_PERSIST_POLL=0) | $(tg $H 128) | $(S $H 128)" b
    for b in 1 3 4; do row="$row | $(S $H 128 FERRY_CUDA_PERSIST_SENTINEL=$b)"; done
    echo "$row"
  done
}
inflight() {
  local row="F16 tg128 poll 1, inflight" k
  for k in 2,1 3,2 4,1 4,2 6,2; do
    left 20 "inflight $k" || break
    row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
  done
  echo "$row | 3,1 $(tg $H 128)"
}
# sentinel_stamps BITS: the branch binary's stamps with FERRY_CUDA_PERSIST_SENTINEL=BITS.
sentinel_stamps() { F=/tmp/ferry-s stamps s$1 FERRY_CUDA_PERSIST_SENTINEL=$1; }
if [[ $CARD == *H200* ]]; then
  echo "--- 1B F16 tg128 (-p 0 -r 5): plan | poll 1 | poll 0"
  for r in 1 2 3; do
    left 30 "F16 round $r" || break
    echo "$(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128) | $(tg $H 128 FERRY_CUDA_PERSIST_POLL=0)"
  done
  inflight
  sentinel_stamps 0
  sentinel_stamps 4
  gen_types bf16
  bench_tables 5 $H /tmp/bf16.gguf $Q $T
  test_ops
  date +%T
  servers_start
  served_rounds 3
  left 60 "tests" && tests "Cuda.Persistent*" $(cap 120)
else
  tests "Cuda.Persistent*" $(cap 120)
  poll_rounds 3
  inflight
  sentinel_stamps 0
  sentinel_stamps 1
  sentinel_stamps 4
  left 30 "BF16" && { gen_types bf16; echo "BF16 tg128 poll 0 | 1: $(tg /tmp/bf16.gguf 128 FERRY_CUDA_PERSIST_POLL=0) | $(tg /tmp/bf16.gguf 128)"; }
fi
date +%T

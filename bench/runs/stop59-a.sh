#!/usr/bin/env bash
# Stop 59, call A (any card). Binaries (carry [".dev59"]): .dev59/ferry.xz, main at 15633df
# (stop 58's .dev58: main's code since differs only in `ferry bench`'s internals), and
# .dev59/ferry-s.xz, branch persist-quant with FERRY_CUDA_PERSIST_SENTINEL's bits (1: down's
# input waited for on one word a lane before its 1,024 are read; 2: after a round of any wait's
# loads finds a word missing, that word alone polled until it is there; 4: any wait's runs'
# last words, one a run of 8, polled at once before the runs are read), and
# .dev59/persist-stamps.py (the branch's summary of FERRY_CUDA_PERSIST_STAMPS=1).
# Stop 58 call C's stamps (H100) put 11-13 us of every 1B layer in the hops between phases,
# 4.2 us (F16) before down, where every warp of 132 blocks polls 8 KB a round (~8.6 MB of L2
# reads a round across the card, against the weights' stream). Prediction: sentinel 1, 3 or 4
# shortens that hop by ~1-2 us a layer, F16 tg128 +2-4%; 4 (every hop) most.
# On an H200: the F16 target first (main: plan | default, three rounds; prediction ~1,335),
# stop 57's copies-in-flight sweep (never run on an H200), then the sentinel rounds, bench tables, test-ops, served rounds. On an H100: the sentinel
# rounds, the stamps of the best against none, the Q4_0 step.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
BIN=${BIN:-.dev59} source bench/runs/common.sh
unxz_bin $BIN/ferry-s.xz /tmp/ferry-s
S() { F=/tmp/ferry-s tg "$@"; }
date +%T
gen_models
sentinel_rounds() { # N
  local r
  echo "--- 1B F16 tg128 (-p 0 -r 5): main | branch sentinel 0 | 1 | 3 | 4 | 6"
  for r in $(seq $1); do
    left 60 "sentinel round $r" || break
    local row="$(tg $H 128) | $(S $H 128)" b
    for b in 1 3 4 6; do row="$row | $(S $H 128 FERRY_CUDA_PERSIST_SENTINEL=$b)"; done
    echo "$row"
  done
}
stamps() { # SENTINEL
  left 20 "stamps $1" || return
  FERRY_CUDA_PERSIST_SENTINEL=$1 FERRY_CUDA_PERSIST_STAMPS=1 /tmp/ferry-s bench -m $H --device CUDA0 -p 0 -n 32 -r 1 > $OUT/stamps-s$1.txt 2>&1
  echo "== stamps, sentinel $1: $(grep tg32 $OUT/stamps-s$1.txt | awk -F'|' '{print $8}')"
  python3 $BIN/persist-stamps.py $OUT/stamps-s$1.txt
}
if [[ $CARD == *H200* ]]; then
  echo "--- 1B F16 tg128 (-p 0 -r 5): plan | default"
  for r in 1 2 3; do
    left 30 "F16 round $r" || break
    echo "$(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
  done
  row="F16 tg128 inflight"
  for k in 2,1 4,1 4,2 6,2 8,2; do
    left 20 "inflight $k" || break
    row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
  done
  echo "$row | default $(tg $H 128)"
  sentinel_rounds 2
  stamps 0
  stamps 4
  gen_types bf16
  for m in $H /tmp/bf16.gguf $Q $T; do
    left 40 "bench $(basename $m)" || break
    $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|memory|weights read"
  done
  left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 1; }
  date +%T
  serve_unix
  serve_tcp 0
  echo "listening: $(servers_up)"
  served_rounds 3
else
  sentinel_rounds 3
  # (With fewer polls the weights' stream may take more copies in flight in the chain.)
  row="F16 tg128 sentinel 4, inflight"
  for k in 3,2 4,1 4,2 6,2; do
    left 30 "inflight $k" || break
    row="$row | $k $(S $H 128 FERRY_CUDA_PERSIST_SENTINEL=4 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
  done
  echo "$row | 3,1 $(S $H 128 FERRY_CUDA_PERSIST_SENTINEL=4)"
  stamps 0
  stamps 3
  stamps 4
  left 30 "Q4_0" && echo "Q4_0 step 0 | 4: $(S $Q 128 FERRY_CUDA_PERSIST=1) | $(S $Q 128 FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_SENTINEL=4)"
fi
date +%T

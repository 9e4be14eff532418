#!/usr/bin/env bash
# Stop 59, call B (any card): call A refuted the polls as the hops' cause (H100: the runs' last
# words polled first, 8 bytes a run instead of 64, made tg128 0.5-1.3% slower and the hop before
# down 4.1 -> 4.6 us). The hops' lengths follow the weights' stream instead: 1.6-1.9 us where
# the producers keep one copy in flight (q/k/v, the attention, wo), 2.7 (wo -> gate/up) and 4.1
# (gate/up -> down) where they keep three. Prediction: the stores and polls wait behind the
# stream's queues; then with one copy in flight everywhere (INFLIGHT=1,1) every hop is ~1.6-1.9
# us, and sentinel bit 8 (one copy in flight while gate/up or down waits for its input) shortens
# those two hops. Binary: branch persist-quant at its bit 8 (.dev59b/ferry.xz, carry
# [".dev59b"]), .dev59b/persist-stamps.py.
BIN=${BIN:-.dev59b} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
gen_models
stamps base
stamps in11 FERRY_CUDA_PERSIST_INFLIGHT=1,1
stamps s8 FERRY_CUDA_PERSIST_SENTINEL=8
echo "--- 1B F16 tg128 (-p 0 -r 5): sentinel 0 | 8 | 3 | 11"
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "$(tg $H 128) | $(tg $H 128 FERRY_CUDA_PERSIST_SENTINEL=8) | $(tg $H 128 FERRY_CUDA_PERSIST_SENTINEL=3) | $(tg $H 128 FERRY_CUDA_PERSIST_SENTINEL=11)"
done
date +%T

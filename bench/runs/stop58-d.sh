#!/usr/bin/env bash
# Stop 58, call D (any card, the session's last device seconds): call C's stamps put the
# longest hop of a layer before down's input (F16 6.1 us, Q4_0 7.2 us after gate/up's last
# block ended; the norms' inputs 3.4-3.7): each warp polls all 1,024 of its words every round.
# FERRY_CUDA_PERSIST_SENTINEL=1 waits on one word a lane first (branch persist-quant + that
# switch; .dev58d: ferry alone, carry [".dev58d"]). 1B F16 and Q4_0 tg128 step, off | on.
BIN=${BIN:-.dev58d} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models > /dev/null 2>&1
for r in 1 2 3; do
  left 25 "round $r" || break
  echo "F16 off | on: $(tg $H 128) | $(tg $H 128 FERRY_CUDA_PERSIST_SENTINEL=1)"
done
left 25 "Q4_0" && echo "Q4_0 step off | on: $(tg $Q 128 FERRY_CUDA_PERSIST=1) | $(tg $Q 128 FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_SENTINEL=1)"
date +%T

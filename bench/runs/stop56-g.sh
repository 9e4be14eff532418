#!/usr/bin/env bash
# Stop 56, calls G on: an H200 alone (any other card: its name, nothing run). The F16 target
# (1B F16 tg128 plan | default, three rounds; prediction ~1,340), the copies in flight swept,
# `ferry bench -p 512 -n 128 -r 5` for F16, BF16 and Q4_0 (GPU memory lines), then served 1B
# Q4_0 local | unix held | unix | tcp held | tcp (held: FERRY_REMOTE_SEND_EARLY=0), three rounds.
# Binaries of main after the server change's revert (.dev56c: the same code). Carry [".dev56c"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
[[ $CARD == *H200* ]] || { echo "$CARD: not an H200, nothing run"; exit 0; }
echo "$CARD"
BIN=${BIN:-.dev56c} source bench/runs/common.sh
gen_models
gen_types bf16
for r in 1 2 3; do
  left 30 "F16 round $r" || break
  echo "F16 tg128 plan | default: $(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
done
row="F16 tg128 inflight"
for k in 2,1 4,1 4,2 6,2 8,2; do row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"; done
echo "$row"
for m in $H /tmp/bf16.gguf $Q; do
  left 40 "bench $(basename $m)" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|memory"
done
date +%T
held() { (export FERRY_REMOTE_SEND_EARLY=0; bt "$@"); }
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served Q4_0: local | unix held | unix | tcp held | tcp"
for r in 1 2 3; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(held $Q --remote unix:$SD/u) | $(bt $Q --remote unix:$SD/u) | $(held $Q --remote tcp:127.0.0.1:$P) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
date +%T

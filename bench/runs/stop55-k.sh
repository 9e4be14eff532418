#!/usr/bin/env bash
# Stop 55, calls K-M: the F16 target, on an H200 only (any other card: the card's name and
# nothing else, to spend no device time). 1B F16 tg128 plan | default three rounds, then
# `ferry bench -p 512 -n 128 -r 5` for F16 and Q4_0, then (call M on) served 1B Q4_0 local |
# unix | tcp: on the H200 host stop 53 had unix 0.974 and tcp 0.975 with a copying local.
# Binaries of 157a746 (.dev55, as call J). Prediction ~1,340-1,360 t/s (stop 53: 1,314 with
# the copy; the store +1.7%); unix ~0.97, tcp ~0.95.
# .dev55: ferry.xz. Carry [".dev55"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
[[ $CARD == *H200* ]] || exit 0
BIN=${BIN:-.dev55} source bench/runs/common.sh
gen_models
for r in 1 2 3; do
  left 30 "F16 round $r" || break
  echo "F16 tg128 plan | default: $(R=5 tg $H 128 FERRY_CUDA_PERSIST=0) | $(R=5 tg $H 128)"
done
for m in $H $Q; do
  left 40 "bench $(basename $m)" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|peak"
done
left 60 "served" || exit 0
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 3
date +%T

#!/usr/bin/env bash
# Stop 56, call D (any card): where a served 1B Q4_0 step's time goes now that the local step
# stores its logits (stop 55: unix 0.966-0.969, tcp 0.918-0.940 of local on an H100, a fixed
# ~17-18 / 35-50 us a step). Session profiles local | unix | tcp, then each transport's step
# trace (FERRY_STEP_TRACE: the server's and client's frames on one clock). On an H200 first
# stop56-b's measurements with the wider sweep (stop56-c).
# Carry [".dev56b"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
if [[ $CARD == *H200* ]]; then
  LIMIT=400 SWEEP="2,1 4,1 4,2 6,2 8,2 3,2" bash bench/runs/stop56-b.sh
fi
BIN=${BIN:-.dev56b} source bench/runs/common.sh
gen_models
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
profiles local unix:$SD/u tcp:127.0.0.1:$P local
served_rounds 2
left 40 "unix trace" && step_trace unix
left 40 "tcp trace" && step_trace tcp
date +%T

#!/usr/bin/env bash
# Stop 56, call H (any card): why the server's early queue (8088fad, reverted) made served unix
# 3% slower. .dev56e is built from branch exp56: that change under FERRY_SERVE_AHEAD_EARLY=1
# (off by default there) and server trace events I, Q/q, W (bench/tools/server-phases.py).
# On one machine: served 1B Q4_0 tg128 local | unix late | unix early, three rounds untraced;
# then each server traced with its client, and the phases of a step.
# Carry [".dev56e"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
BIN=${BIN:-.dev56e} source bench/runs/common.sh
$F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
mkdir -p $OUT/late $OUT/early
FERRY_STEP_TRACE=$OUT/late $F serve --listen unix:$SD/l --device CUDA0 > $SD/l.log 2>&1 &
SERVER_PIDS+=($!)
FERRY_STEP_TRACE=$OUT/early FERRY_SERVE_AHEAD_EARLY=1 $F serve --listen unix:$SD/e --device CUDA0 > $SD/e.log 2>&1 &
SERVER_PIDS+=($!)
sleep 3
echo "--- served Q4_0 (the servers traced, the rounds' clients not): local | unix late | unix early"
for r in 1 2 3; do
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/l) | $(bt $Q --remote unix:$SD/e)"
done
kill ${SERVER_PIDS[*]}
sleep 1
rm -f $OUT/late/* $OUT/early/*
FERRY_STEP_TRACE=$OUT/late $F serve --listen unix:$SD/l2 --device CUDA0 > $SD/l2.log 2>&1 &
SERVER_PIDS+=($!)
FERRY_STEP_TRACE=$OUT/early FERRY_SERVE_AHEAD_EARLY=1 $F serve --listen unix:$SD/e2 --device CUDA0 > $SD/e2.log 2>&1 &
SERVER_PIDS+=($!)
sleep 3
echo "late traced: $(FERRY_STEP_TRACE=$OUT/late bt $Q --remote unix:$SD/l2)"
echo "early traced: $(FERRY_STEP_TRACE=$OUT/early bt $Q --remote unix:$SD/e2)"
kill ${SERVER_PIDS[*]}
sleep 1
for k in late early; do
  echo "--- $k"
  for d in $OUT/$k; do python3 bench/tools/server-phases.py $d; done
done
date +%T

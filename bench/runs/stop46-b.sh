#!/usr/bin/env bash
# Stop 46, call B: where a served step's time goes, both processes on one clock
# (FERRY_STEP_TRACE, bench/tools/step-trace.py): 1B Q4_0 tg128 clients over unix and tcp, each
# against its own server, plus session profiles (local | unix | tcp) beside them.
# Carry [".dev21"].
BIN=${BIN:-.dev21} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
TR=$OUT/trace && mkdir -p $TR/u $TR/t
FERRY_STEP_TRACE=$TR/u $F serve --listen unix:$SD/u --device CUDA0 > $SD/u.log 2>&1 &
SERVER_PIDS+=($!)
FERRY_STEP_TRACE=$TR/t $F serve --listen tcp:127.0.0.1:$P --device CUDA0 > $SD/t0.log 2>&1 &
SERVER_PIDS+=($!)
echo "listening: $(servers_up)"
bt $Q --device CUDA0 > /dev/null
for r in 1 2; do
  echo "local $(bt $Q --device CUDA0) | unix $(FERRY_STEP_TRACE=$TR/u bt $Q --remote unix:$SD/u) | tcp $(FERRY_STEP_TRACE=$TR/t bt $Q --remote tcp:127.0.0.1:$P)"
done
profiles local unix:$SD/u tcp:127.0.0.1:$P
kill ${SERVER_PIDS[*]} 2>/dev/null; sleep 2
for d in u t; do echo "=== $d"; python3 bench/tools/step-trace.py $TR/$d; done
tar -C $OUT -cJf $OUT/trace.tar.xz trace && rm -rf $TR

#!/usr/bin/env bash
# Stop 56, call I (any card; on an H200 stop56-g's measurements first). The server's early queue
# placed where the read waits (cmd_tensor_io; 8088fad's place came after that wait, so it never
# queued: stop56-h's trace had no 'Q'). The served and queued-ahead tests (the unix server's 'Q'
# counted); served 1B Q4_0 tg128 local | unix late (FERRY_SERVE_AHEAD_EARLY=0) | unix | tcp,
# four rounds; each unix server's step traced (bench/tools/server-phases.py).
# Prediction: unix +1-2% against late (the server's launch, ~8-10 us, off the critical path).
# Binaries of this commit (.dev56f: ferry.xz, test_cuda.xz, fx.tar.xz). Carry [".dev56f"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
if [[ $CARD == *H200* ]]; then BIN=.dev56f LIMIT=330 bash bench/runs/stop56-g.sh; fi
BIN=${BIN:-.dev56f} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
$F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1 &
GEN=$!
tests "*Served*:*QueuedAhead*" $(cap 150)
grep "queued before its wait" $OUT/test_cuda.*.txt
wait $GEN
serve_unix
env FERRY_SERVE_AHEAD_EARLY=0 $F serve --listen unix:$SD/o --device CUDA0 > $SD/o.log 2>&1 &
SERVER_PIDS+=($!)
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served Q4_0: local | unix late | unix | tcp"
for r in 1 2 3 4; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/o) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
mkdir -p $OUT/late $OUT/early
FERRY_STEP_TRACE=$OUT/late FERRY_SERVE_AHEAD_EARLY=0 $F serve --listen unix:$SD/l2 --device CUDA0 > $SD/l2.log 2>&1 &
SERVER_PIDS+=($!)
FERRY_STEP_TRACE=$OUT/early $F serve --listen unix:$SD/e2 --device CUDA0 > $SD/e2.log 2>&1 &
SERVER_PIDS+=($!)
sleep 3
echo "late traced: $(FERRY_STEP_TRACE=$OUT/late bt $Q --remote unix:$SD/l2)"
echo "early traced: $(FERRY_STEP_TRACE=$OUT/early bt $Q --remote unix:$SD/e2)"
sleep 1
for k in late early; do
  echo "--- $k"
  python3 bench/tools/server-phases.py $OUT/$k
done
date +%T

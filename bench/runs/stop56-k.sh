#!/usr/bin/env bash
# Stop 56, call K (run inline on call J's warm H100, recorded here as it ran): served 1B Q4_0
# tg128, local | unix late (FERRY_SERVE_AHEAD_EARLY=0) | unix | tcp, three rounds, with
# .dev56f (the server's early queue and the client's early send). Carry [".dev56f"].
BIN=${BIN:-.dev56f} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
$F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
serve_unix
env FERRY_SERVE_AHEAD_EARLY=0 $F serve --listen unix:$SD/o --device CUDA0 > $SD/o.log 2>&1 &
SERVER_PIDS+=($!)
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- local | unix late | unix | tcp"
for r in 1 2 3; do
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/o) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
date +%T

#!/usr/bin/env bash
# Stop 47, call E: call D's tests again with the fixtures carried (test_cuda reads them at its
# start), then main's build served side by side (local | unix | tcp), four rounds.
# Carry [".dev25"].
BIN=${BIN:-.dev25} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*Served*:*Progressive*" $(cap 120)
gen_models
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --device CUDA0 > /dev/null
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served: local | unix | tcp"
for r in 1 2 3 4; do
  left 30 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done

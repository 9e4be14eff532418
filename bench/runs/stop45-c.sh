#!/usr/bin/env bash
# Stop 45, call C: the idle watcher (a step queued ahead that no inputs come for within 20 ms
# is released by a thread of the backend) and the remote client's check ahead: the
# queued-ahead tests (a 60 ms pause in the script), the served ones, tg128 side by side
# against FERRY_AHEAD=0 again, and served rounds (local | unix | tcp).
# Carry [".dev20"].
BIN=.dev20 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*StepsQueuedAhead*:*ServedTcp*:*ProgressiveResults*:*SameLogitsEveryRun*" $(cap 60)
grep "queued ahead" $OUT/test_cuda.stop45-c.1.txt
gen_models
for m in $Q $T; do
  echo "--- $(basename $m): ahead | FERRY_AHEAD=0"
  bt $m --device CUDA0 > /dev/null
  for r in 1 2 3; do
    left 30 "round $r" || break
    echo "$(bt $m --device CUDA0) | $(FERRY_AHEAD=0 bt $m --device CUDA0)"
  done
done
left 100 served || exit 0
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
echo "--- 1B Q4_0: local | unix | tcp"
bt $Q --remote unix:$SD/u > /dev/null
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
for r in 1 2 3; do
  left 30 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done

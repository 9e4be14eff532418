#!/usr/bin/env bash
# Stop 46, call A: stop 45's call C (never ran: the idle watcher, the remote client's check
# ahead, e983626's refactor; the queued-ahead tests pause 60 ms and ask for an idle release),
# then where a tcp step's time goes against unix: session profiles of local, unix and tcp
# clients and the tcp server's progressive-reply trace (FERRY_SERVE_PIECE_TRACE=1); raw loopback
# tcp on this host (bench_tcp_stripes), and a tcp server and its client pinned to separate
# halves of the cores (taskset) beside the unpinned ones: is the tcp gap the host's scheduling?
# Carry [".dev20"] (e983626's binaries).
BIN=.dev20 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)|Thread|MHz" | head -5
if [ -z "${SERVED_ONLY:-}" ]; then
tests "*StepsQueuedAhead*:*ServedTcp*:*ProgressiveResults*:*SameLogitsEveryRun*" $(cap 150)
grep "queued ahead" $OUT/test_cuda.stop46-a.1.txt
gen_models
for m in $Q $T; do
  echo "--- $(basename $m): ahead | FERRY_AHEAD=0"
  bt $m --device CUDA0 > /dev/null
  for r in 1 2 3; do
    left 30 "round $r" || break
    echo "$(bt $m --device CUDA0) | $(FERRY_AHEAD=0 bt $m --device CUDA0)"
  done
done
fi
gen_models
left 100 served || exit 0
.dev20/bench_tcp_stripes 513024 2000 2>&1 | tail -8
NC=$(nproc) HALF=$(($(nproc) / 2))
serve_unix
serve_tcp 0 FERRY_SERVE_PIECE_TRACE=1
taskset -c $HALF-$((NC - 1)) $F serve --listen tcp:127.0.0.1:$((P + 1)) --device CUDA0 > $SD/t1.log 2>&1 &
SERVER_PIDS+=($!)
echo "listening: $(servers_up)"
echo "--- 1B Q4_0: local | unix | tcp | tcp pinned (server cores $HALF-$((NC - 1)), client 0-$((HALF - 1)))"
bt $Q --remote unix:$SD/u > /dev/null
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
for r in 1 2 3; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P) | $(F="taskset -c 0-$((HALF - 1)) $F" bt $Q --remote tcp:127.0.0.1:$((P + 1)))"
done
left 40 profiles || exit 0
FERRY_SERVE_PROFILE=1 $F serve --listen unix:$SD/up --device CUDA0 > $SD/up.log 2>&1 &
SERVER_PIDS+=($!)
serve_tcp 2 FERRY_SERVE_PROFILE=1
sleep 3
profiles local unix:$SD/u tcp:127.0.0.1:$P unix:$SD/up tcp:127.0.0.1:$((P + 2)) local unix:$SD/u tcp:127.0.0.1:$P
kill ${SERVER_PIDS[*]} 2>/dev/null; sleep 1
grep -h "progressive replies" $SD/*.log | tail -8
grep -h "profile:" $SD/up.log $SD/t2.log | tail -4

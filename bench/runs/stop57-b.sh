#!/usr/bin/env bash
# Stop 57, call B (any card): why a new tcp connection's first ~230 decode steps run ~30 us
# slower (call A's follow-up trace: a fresh server and client, 1B Q4_0, the step period 590-597
# us for steps 0-255, then 562-565; the client's request reached the server 24 us after its
# send instead of 4.6, the server handled a compute in 3.2 us instead of 1.2 and sent stripe 0
# 7.0 us after the last piece instead of 3.7, while the client's own gap stayed 1.5 us).
# Prediction: spinning threads of the server and the client (main threads, stripe lanes) start
# on hyperthread siblings or one core, and the scheduler spreads them after ~0.1 s; so the slow
# phase goes away when the server and client are pinned to disjoint physical cores, and it shows
# over unix too (less: no lanes). Each trace: a fresh server; the threads' CPUs sampled during
# the run. Binaries of main (.dev57); carry [".dev57"].
# (On an H200 the F16 target comes first: call A's script, whose H200 part leads.)
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader) == *H200* ]]; then
  LIMIT=${LIMIT:-190} exec bash bench/runs/stop57-a.sh
fi
nvidia-smi --query-gpu=name --format=csv,noheader
nproc
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"
lscpu -e=CPU,CORE,SOCKET,NODE | head -40
BIN=${BIN:-.dev57} source bench/runs/common.sh
gen_models
bt $Q --device CUDA0 > /dev/null
# trace NAME KIND [taskset CPUS for the server] [for the client]: a traced server and client.
trace() {
  local name=$1 kind=$2 scpu=${3:-} ccpu=${4:-} tr=$OUT/tr-$1 addr pid
  mkdir -p $tr
  if [ $kind = unix ]; then addr=unix:$SD/ut-$name; else addr=tcp:127.0.0.1:$((P + 9 + RANDOM % 100)); fi
  local ts=() tc=()
  [ -n "$scpu" ] && ts=(taskset -c $scpu)
  [ -n "$ccpu" ] && tc=(taskset -c $ccpu)
  FERRY_STEP_TRACE=$tr "${ts[@]}" $F serve --listen $addr --device CUDA0 > $SD/t-$name.log 2>&1 &
  pid=$!
  SERVER_PIDS+=($pid)
  sleep 3
  (export FERRY_STEP_TRACE=$tr; "${tc[@]}" $F bench -m $Q --remote $addr -p 0 -n 128 -r 3 2>&1 |
    awk -F'|' '$7 ~ /tg128/ {print $8}') > $SD/r-$name.txt &
  local cpid=$!
  for s in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    echo "[$name t$s] server: $(ps -L -o psr= -o pcpu= -p $pid 2>/dev/null | awk '$2 > 20 {printf "%s ", $1}')| client: $(ps -L -o psr= -o pcpu= -p $(pgrep -n -f "bench -m $Q --remote") 2>/dev/null | awk '$2 > 20 {printf "%s ", $1}')"
  done
  wait $cpid
  echo "$name ($kind${scpu:+, server on $scpu}${ccpu:+, client on $ccpu}): $(cat $SD/r-$name.txt)"
  kill $pid
  sleep 1
}
trace tcp tcp
trace unix unix
# Server and client on disjoint physical cores (lscpu's CORE column): the CPUs of the first half
# of the cores for the server, the rest for the client.
cores=$(lscpu -p=CORE | grep -v '^#' | sort -un | wc -l)
sc=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, -v h=$((cores / 2)) '$2 < h {print $1}' | paste -sd,)
cc=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, -v h=$((cores / 2)) '$2 >= h {print $1}' | paste -sd,)
trace tcp-split tcp $sc $cc
trace tcp-again tcp
date +%T

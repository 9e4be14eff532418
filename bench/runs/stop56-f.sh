#!/usr/bin/env bash
# Stop 56, call F (any card). Call E (H100) showed the client's send-early (the step sent before
# compute_ahead's compare) cut the client's gap from the read's reply to the next send (7.0 ->
# 3.3 us unix, 7.9 -> 2.8 tcp, medians) but not the step: the server's launch of the next step
# (queue_ahead, after its reply) then held the request (reply -> next compute header 11.6 ->
# 15.7 us unix). Now a read answered whole queues the step before the server waits for the
# step. On an H200 first the F16 target (as stop56-e). Then on any card: the served and
# queued-ahead tests; served 1B Q4_0 tg128, local | unix old | unix client only | unix | tcp old |
# tcp (old: FERRY_REMOTE_SEND_EARLY=0 and a server with FERRY_SERVE_AHEAD_EARLY=0; client
# only: the new client, the old server), three rounds; the unix server's graph stats; traces.
# Prediction: unix ~+1% against old (the step period ~559 -> ~553 us); tcp as call E (+0-4%).
# Binaries of this commit (.dev56d: ferry.xz, test_cuda.xz, fx.tar.xz). Carry [".dev56d"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
BIN=${BIN:-.dev56d} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
if [[ $CARD == *H200* ]]; then
  gen_models
  gen_types bf16
  for r in 1 2 3; do
    left 30 "F16 round $r" || break
    echo "F16 tg128 plan | default: $(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
  done
  row="F16 tg128 inflight"
  for k in 2,1 4,1 4,2 6,2 8,2; do row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"; done
  echo "$row"
  for m in $H /tmp/bf16.gguf $Q; do
    left 40 "bench $(basename $m)" || break
    $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|memory"
  done
  date +%T
fi
gen_models &
GEN=$!
tests "*Served*:*QueuedAhead*" $(cap 150)
wait $GEN
held() { (export FERRY_REMOTE_SEND_EARLY=0; bt "$@"); }
serve_unix FERRY_CUDA_GRAPH_STATS=1
env FERRY_SERVE_AHEAD_EARLY=0 $F serve --listen unix:$SD/o --device CUDA0 > $SD/o.log 2>&1 &
SERVER_PIDS+=($!)
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served Q4_0: local | unix old | unix client only | unix | tcp old | tcp"
for r in 1 2 3; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(held $Q --remote unix:$SD/o) | $(bt $Q --remote unix:$SD/o) | $(bt $Q --remote unix:$SD/u) | $(held $Q --remote tcp:127.0.0.1:$P) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
grep "graph stats" $SD/u.log | tail -2
left 40 "unix trace" && step_trace unix
left 40 "tcp trace" && step_trace tcp
date +%T

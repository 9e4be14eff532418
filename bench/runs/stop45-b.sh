#!/usr/bin/env bash
# Stop 45, call B: steps queued ahead, the rest: every test_cuda test (fixtures but q4_1 and
# q5_k_m), tcp servers with and without FERRY_SERVE_AHEAD=0 side by side, BF16 side by side,
# and `ferry bench -p 512 -n 128 -r 5` for the README.
# Carry [".dev20"] (binaries and fx.tar.xz).
BIN=.dev20 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "-*q4_1*:*q5_k_m*:*Q5KM*:*RingDecodeEquals*:*TwoGpus*" $(cap 150)
gen_models
gen_types bf16
echo "--- bf16: ahead | FERRY_AHEAD=0"
for r in 1 2 3; do echo "$(bt /tmp/bf16.gguf --device CUDA0) | $(FERRY_AHEAD=0 bt /tmp/bf16.gguf --device CUDA0)"; done
serve_unix
serve_tcp 0
FERRY_SERVE_AHEAD=0 $F serve --listen tcp:127.0.0.1:$((P + 1)) --device CUDA0 > $SD/t1.log 2>&1 &
SERVER_PIDS+=($!)
echo "listening: $(servers_up)"
for model in $Q $H; do
  echo "--- $(basename $model): local | unix | tcp | tcp FERRY_SERVE_AHEAD=0"
  bt $model --remote tcp:127.0.0.1:$P > /dev/null
  bt $model --remote tcp:127.0.0.1:$((P + 1)) > /dev/null
  n=4; [ $model = $H ] && n=2
  for r in $(seq $n); do
    left 40 "served round $r" || break
    echo "$(bt $model --device CUDA0) | $(bt $model --remote unix:$SD/u) | $(bt $model --remote tcp:127.0.0.1:$P) | $(bt $model --remote tcp:127.0.0.1:$((P + 1)))"
  done
done
left 90 bench || exit 0
for m in $H $Q $T; do $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E 'pp512|tg128'; done

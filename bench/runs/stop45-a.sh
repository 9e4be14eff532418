#!/usr/bin/env bash
# Stop 45, call A: decode steps queued ahead (Backend::compute_ahead / run_ahead: the next
# one-token step launched while the host reads the last one's logits, its staged-input kernel
# waiting for the inputs; servers queue a session's step once its logits have been sent).
# Tests, then tg128 side by side against FERRY_AHEAD=0 (the same binary), session profiles,
# and served rounds: local | unix | unix with FERRY_SERVE_AHEAD=0 | tcp.
# Carry [".dev20"].
BIN=.dev20 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*StepsQueuedAhead*:*SameLogitsEveryRun*:*ReplayedGraph*:*StagedInputs*:*InPlace*:*Alternating*:*LongDecode*:*CudaOracle*/f16:*CudaOracle*/q8_0:*ServedTcp*" $(cap 200)
grep "queued ahead" $OUT/test_cuda.stop45-a.1.txt
gen_models
for m in $T $Q $H; do
  echo "--- $(basename $m): ahead | FERRY_AHEAD=0"
  bt $m --device CUDA0 > /dev/null
  for r in 1 2 3; do
    left 40 "round $r" || break
    echo "$(bt $m --device CUDA0) | $(FERRY_AHEAD=0 bt $m --device CUDA0)"
  done
done
left 30 profiles && for a in 1 0; do
  echo "ahead=$a: $(FERRY_AHEAD=$a FERRY_SESSION_PROFILE=1 FERRY_CUDA_GRAPH_STATS=1 $F bench -m $Q --device CUDA0 -p 0 -n 128 -r 2 2>&1 | grep -E 'per step|graph stats' | tr '\n' ' ')"
done
left 100 served || exit 0
serve_unix
FERRY_SERVE_AHEAD=0 $F serve --listen unix:$SD/u0 --device CUDA0 > $SD/u0.log 2>&1 &
SERVER_PIDS+=($!)
serve_tcp 0
echo "listening: $(servers_up)"
for model in $Q $H; do
  echo "--- $(basename $model): local | unix | unix FERRY_SERVE_AHEAD=0 | tcp"
  bt $model --remote unix:$SD/u > /dev/null
  bt $model --remote tcp:127.0.0.1:$P > /dev/null
  for r in 1 2 3; do
    left 40 "served round $r" || break
    echo "$(bt $model --device CUDA0) | $(bt $model --remote unix:$SD/u) | $(bt $model --remote unix:$SD/u0) | $(bt $model --remote tcp:127.0.0.1:$P)"
  done
done

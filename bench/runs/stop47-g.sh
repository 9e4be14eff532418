#!/usr/bin/env bash
# Stop 47, call G: the mirror's tail (FERRY_CUDA_MIRROR_TAIL=T, new: after the last whole step
# of W x 8 rows, steps of W x T rows, runs of T rows). Call D's trace: the last step (9,984
# rows of the 1B vocabulary's 128,256, run by 1,248 of the 2,112 warps) flagged at 559 us, the
# client had it all 14 us later. A tail of T = 1, 2 or 4 shares those rows among every warp
# in 5, 3 or 2 steps, the last of them 1,536 rows (6 KB). Prediction: tcp +0.5-1.5% at T 1-2,
# local with pieces forced nearly unchanged (smaller stores, more counts, better balance).
# Then the tests: the served and progressive ones in main's form and with T 1, 2.
# Carry [".dev27"].
BIN=.dev27 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*Served*:*Progressive*" $(cap 100)
FERRY_CUDA_MIRROR_TAIL=2 tests "*Progressive*:*ServedTcp*" $(cap 60)
FERRY_CUDA_MIRROR_TAIL=1 tests "*Progressive*:*ServedTcp*" $(cap 60)
gen_models
M=FERRY_CUDA_PIECES=8
echo "--- local, nobody reading: none | mirrored | T 1 | T 2 | T 4"
bt $Q --device CUDA0 > /dev/null
for r in 1 2; do
  echo "$(bt $Q --device CUDA0) | $(be $M) | $(be $M FERRY_CUDA_MIRROR_TAIL=1) | $(be $M FERRY_CUDA_MIRROR_TAIL=2) | $(be $M FERRY_CUDA_MIRROR_TAIL=4)"
done
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_MIRROR_TAIL=1
serve_tcp 2 FERRY_CUDA_MIRROR_TAIL=2
serve_tcp 3 FERRY_CUDA_MIRROR_TAIL=4
TR=$OUT/trace && mkdir -p $TR
FERRY_STEP_TRACE=$TR FERRY_CUDA_MIRROR_TAIL=2 $F serve --listen tcp:127.0.0.1:$((P + 9)) --device CUDA0 > $SD/t9.log 2>&1 &
SERVER_PIDS+=($!)
echo "listening: $(servers_up)"
for k in 0 1 2 3; do bt $Q --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
echo "--- served: local | unix | tcp main | T 1 | T 2 | T 4"
for r in 1 2 3 4; do
  left 40 "served round $r" || break
  row="$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u)"
  for k in 0 1 2 3; do row="$row | $(bt $Q --remote tcp:127.0.0.1:$((P + k)))"; done
  echo "$row"
done
left 15 "the trace" || exit 0
FERRY_STEP_TRACE=$TR bt $Q --remote tcp:127.0.0.1:$((P + 9))
kill ${SERVER_PIDS[*]} 2>/dev/null; sleep 2
python3 bench/tools/step-trace.py $TR

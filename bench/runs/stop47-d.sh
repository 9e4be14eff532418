#!/usr/bin/env bash
# Stop 47, call D: (1) main's build with the server's piece trace folded into the step trace
# (.dev25): the served tests, ServedTcpLogitsEqualLocalWithProgressiveReads now checking the
# server's trace (pieces in order, none with FERRY_CUDA_PIECES=0), and the step trace of a tcp
# client with every piece's time; (2) what is left of tcp's gap is the last step's send (~10 us
# from its flag to the stripes out, call C): more stripes (client FERRY_REMOTE_STRIPES=2, the
# default here, 4, 8) against servers mirroring runs of 8 rows (main) and 16 (64-byte lines,
# cheaper locally, +1.1% in call A, but steps twice the size), with call A's knob build
# (.dev23k/ferry.xz, form 4 = main's order). Carry [".dev25", ".dev23k"].
BIN=.dev25 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
tests "*Served*:*Progressive*" $(cap 120)
gen_models
TR=$OUT/trace && mkdir -p $TR
FERRY_STEP_TRACE=$TR $F serve --listen tcp:127.0.0.1:$((P + 9)) --device CUDA0 > $SD/t9.log 2>&1 &
SERVER_PIDS+=($!)
unxz_bin .dev23k/ferry.xz /tmp/ferry23
K=/tmp/ferry23
for g in 8 16; do
  o=$((g / 8))
  env FERRY_CUDA_MIRROR_FENCE=4 FERRY_CUDA_MIRROR_GROUP=$g $K serve --listen tcp:127.0.0.1:$((P + o)) --device CUDA0 > $SD/t$o.log 2>&1 &
  SERVER_PIDS+=($!)
done
serve_unix
echo "listening: $(servers_up)"
bt $Q --device CUDA0 > /dev/null
FERRY_STEP_TRACE=$TR bt $Q --remote tcp:127.0.0.1:$((P + 9))
bs() { (export FERRY_REMOTE_STRIPES=$1; bt $Q --remote tcp:127.0.0.1:$((P + $2))); }
for o in 1 2; do bs 2 $o > /dev/null; done
echo "--- served: local | unix | G8 s2 | G8 s4 | G8 s8 | G16 s2 | G16 s4 | G16 s8"
for r in 1 2 3; do
  left 45 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bs 2 1) | $(bs 4 1) | $(bs 8 1) | $(bs 2 2) | $(bs 4 2) | $(bs 8 2)"
done
kill ${SERVER_PIDS[*]} 2>/dev/null; sleep 2
python3 bench/tools/step-trace.py $TR

#!/usr/bin/env bash
# Run A of stop 37: stop36-b.sh (the chained products) and then stop36-a.sh (the element-read
# types' prefill, the _wide op cases, the q5_k_m pin) in one call, since machines came rarely:
# what matters most runs first, and each step of either starts only while the call has time for
# it (LIMIT, 585 s unless set; bench/runs/common.sh). Their files: log.txt (tee the output),
# test_cuda.stop36-{b,a}.N.txt, text.{0,1}.txt, test-ops.{0,1}.txt: eight, what a call returns.
# For a call of about four minutes: LIMIT=230 bash bench/runs/stop36-b.sh alone.
# (The predictions are in stop36-a.sh and stop36-b.sh.) Carry [".devB"].
LIMIT=${LIMIT:-585}
LIMIT=$LIMIT bash bench/runs/stop36-b.sh
LIMIT=$((LIMIT - SECONDS)) bash bench/runs/stop36-a.sh

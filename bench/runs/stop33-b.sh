#!/usr/bin/env bash
# Run B (stop 33, prepared; not yet run): run A's binaries.
#  1. Where tcp's host time goes (stop 32 run E: the client's build + inputs + compute call
#     took 22 us a step over tcp against 11 over unix, though the compute call makes no system
#     call; a study on the 2-core VM found one sendmsg and one recvmsg a step on each side and
#     no extra call). The suspect: the threads that spin beside the client's (its stripe lane
#     polls 2 ms after each transfer without a pause instruction, the server's lane 20 ms).
#     Profiles of a 1B Q4_0 client: local, unix, tcp with the default 2 stripes, tcp with 1
#     stripe (no lane thread), tcp with lanes that sleep between transfers on both sides
#     (FERRY_LANE_IDLE_SPIN_US=0: the client's and a second server's), twice each. Prediction
#     if the suspect is right: with 1 stripe and with sleeping lanes the host parts fall to
#     unix's (with 1 stripe the logits read grows: one connection).
#  2. Unix sessions that copy the logits piece by piece (stop32-unix-pieces.patch,
#     FERRY_SERVE_UNIX_PIECES=1 on the server) against the default (one device-to-host copy
#     after the step), six rounds side by side: bench/serve-step.sh's "off" columns are the
#     servers started with that variable. Prediction: unix 0.96-0.97 -> ~0.98; tcp unchanged.
#  3. BULK=S (after run A, if a bulk form won): the served ratios with servers in that form.
BIN=${BIN:-.devA}
source bench/runs/common.sh
gen_models
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_LANE_IDLE_SPIN_US=0
echo "=== $(date -u +%T) servers: $(servers_up); profiles, twice"
for r in 1 2; do
  profiles local unix:$SD/u tcp:127.0.0.1:$P FERRY_REMOTE_STRIPES=1 tcp:127.0.0.1:$P \
    FERRY_LANE_IDLE_SPIN_US=0 tcp:127.0.0.1:$((P + 1))
done
kill ${SERVER_PIDS[*]} 2>/dev/null
echo "=== $(date -u +%T) 1B Q4_0: default servers (on) against FERRY_SERVE_UNIX_PIECES=1 (off)"
SERVER_AB=1 SERVER_ENV="FERRY_SERVE_UNIX_PIECES=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 6 128 2>&1 | grep -E "t/s:|/ local|/ off"
if [ -n "${BULK:-}" ]; then
  echo "=== $(date -u +%T) default servers (on) against $BULK (off): 1B F16, then 1B Q4_0"
  SERVER_AB=1 SERVER_ENV="$BULK" DEVICE=CUDA0 \
    bash bench/serve-step.sh $F $H 3 128 2>&1 | grep -E "t/s:|/ local|/ off"
  SERVER_AB=1 SERVER_ENV="$BULK" DEVICE=CUDA0 \
    bash bench/serve-step.sh $F $Q 4 128 2>&1 | grep -E "t/s:|/ local|/ off"
fi
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run B (stop 28): where a served tcp step's time goes, with the stripe lanes of run A now
# polling through a read's wait (run A's server lanes slept after 300 us, before a step's
# logits were ready). One unix and one tcp server (FERRY_SERVE_PROFILE=1); 1B Q4_0 tg128
# locally and through each, the client with FERRY_SESSION_PROFILE=1 and FERRY_REMOTE_STATS=1
# (tcp with 1, 2, 4 and 8 stripes), then serve-step's side by side rounds: the default client
# (4 stripes on this host) against FERRY_REMOTE_STRIPES=1.
# .devF holds ferry.xz, bench_tcp_stripes and fx/; carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
FERRY_SERVE_PROFILE=1 $F serve --listen unix:$dir/s --device CUDA0 > $dir/u.log 2>&1 &
FERRY_SERVE_PROFILE=1 $F serve --listen tcp:127.0.0.1:$port --device CUDA0 > $dir/t.log 2>&1 &
for _ in $(seq 300); do grep -q listening $dir/u.log && grep -q listening $dir/t.log && break; sleep 0.1; done
prof() { # NAME ENV... -- ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "--- $name"
  env FERRY_SESSION_PROFILE=1 FERRY_REMOTE_STATS=1 "${envs[@]}" $F bench -m $Q -p 0 -n 128 -r 3 "$@" 2>&1 |
    grep -E "tg128|session profile|ferry remote" | sed 's/HELLO=.*//'
}
echo "=== $(date -u +%T) profiles"
prof local -- --device CUDA0
prof unix -- --remote unix:$dir/s
for k in 1 2 4 8; do prof "tcp, $k stripes" FERRY_REMOTE_STRIPES=$k -- --remote tcp:127.0.0.1:$port; done
prof local -- --device CUDA0
sleep 0.5
echo "server profiles (one per client session above, in order):"
grep -h "profile" $dir/u.log | sed 's/^/unix: /' | sed 's/LIST_DEVICES.*BUFFER_CLEAR[^;]*;//'
grep -h "profile" $dir/t.log | sed 's/^/tcp: /' | sed 's/LIST_DEVICES.*BUFFER_CLEAR[^;]*;//'
kill %1 %2 2>/dev/null
echo "=== $(date -u +%T) served: default clients (4 stripes) against FERRY_REMOTE_STRIPES=1"
SERVER_AB=1 SERVER_ENV="FERRY_UNUSED=1" CLIENT_ENV="FERRY_REMOTE_STRIPES=1" DEVICE=CUDA0 \
  bash bench/serve-step.sh $F $Q 5 128 2>&1 | tail -16
echo "=== $(date -u +%T) done"

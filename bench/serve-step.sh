#!/usr/bin/env bash
# Decode through `ferry serve` against local, and the served step's batching on against off,
# side by side in the same minutes: starts one `ferry serve` on a unix socket and one on tcp
# loopback, then REPS times runs, back to back,
#   local | unix | unix, batching off | tcp | tcp, batching off
# with `ferry bench -m MODEL -p 0 -n N -r R`, and prints every run, the medians, each served
# column's per-repetition ratio to the local run of its repetition, and on / off per
# transport. "Batching off" is the client of the same build with FERRY_REMOTE_FOLD=0 (every
# input its own TENSOR_SET frame, as protocol 3 sent them) and FERRY_REMOTE_HOLD_COMPUTE=0
# (the compute sent at once, apart from the read that follows it).
#
# Usage: [DEVICE=CUDA0] [THREADS=2] [R=3] [OFF=0] [CHECK=1] [PROFILE=1] bench/serve-step.sh FERRY MODEL [REPS] [N]
#   DEVICE   the device to run locally and to serve (default: the local default device;
#            the servers then serve every local device and the client picks the first)
#   THREADS  -t for the local runs and the servers (CPU devices); default: ferry's own
#   OFF=0    skip the "batching off" columns
#   PROFILE=1  servers with FERRY_SERVE_PROFILE=1 and one more client run per transport with
#            FERRY_REMOTE_STATS=1 after the timed rows: where a served step's time goes on
#            the server (per command) and the client's sends, receives and waits
#   SERVER_AB=1  the "off" columns are the default client against a second pair of servers
#            with the server's per-step changes off (FERRY_SERVE_DEFER_SYNC=0: wait after
#            every compute; FERRY_SERVE_REVALIDATE_ALL=1: validate every entry of a new table),
#            or with SERVER_ENV="FERRY_X=1 ..." in their environment instead (and
#            CLIENT_ENV="FERRY_Y=1 ..." in the environment of the clients of those columns)
#   BENCH_ARGS="--kv-pad 256"  more arguments for every `ferry bench` run (local and served)
#   CHECK=1  first run `ferry test-ops` on the served device over both transports (every op
#            case against the float64 reference: the served inputs, computes and reads of
#            this build, tcp's reads of device memory included) and print the summary lines
# On the H200 machine (1B Q4_0 tg128, the issue's target: unix >= 0.97, tcp >= 0.95):
#   DEVICE=CUDA0 bench/serve-step.sh build/release/bin/ferry M.gguf 5 128
# On the 2-core VM (CPU device):
#   THREADS=2 R=10 bench/serve-step.sh build/release/bin/ferry tiny-llama-q8_0.gguf 8 64
set -euo pipefail
ferry="$1" model="$2" reps="${3:-5}" n="${4:-128}" r="${R:-3}"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
dev_args=() thr_args=()
[ -n "${DEVICE:-}" ] && dev_args=(--device "$DEVICE")
[ -n "${THREADS:-}" ] && thr_args=(-t "$THREADS")
prof=()
[ "${PROFILE:-0}" = 1 ] && prof=(FERRY_SERVE_PROFILE=1)
env "${prof[@]}" "$ferry" serve --listen "unix:$dir/s" "${dev_args[@]}" "${thr_args[@]}" >"$dir/unix.log" 2>&1 &
unix_pid=$!
env "${prof[@]}" "$ferry" serve --listen "tcp:127.0.0.1:$port" "${dev_args[@]}" "${thr_args[@]}" >"$dir/tcp.log" 2>&1 &
tcp_pid=$!
uoff="unix:$dir/s" toff="tcp:127.0.0.1:$port"
off=(FERRY_REMOTE_FOLD=0 FERRY_REMOTE_HOLD_COMPUTE=0)
pids=($unix_pid $tcp_pid)
if [ "${SERVER_AB:-0}" = 1 ]; then
  port2=$((port + 1))
  read -r -a senv <<< "${SERVER_ENV:-FERRY_SERVE_DEFER_SYNC=0 FERRY_SERVE_REVALIDATE_ALL=1}"
  env "${prof[@]}" "${senv[@]}" "$ferry" serve --listen "unix:$dir/s2" "${dev_args[@]}" "${thr_args[@]}" >"$dir/unix2.log" 2>&1 &
  pids+=($!)
  env "${prof[@]}" "${senv[@]}" "$ferry" serve --listen "tcp:127.0.0.1:$port2" "${dev_args[@]}" "${thr_args[@]}" >"$dir/tcp2.log" 2>&1 &
  pids+=($!)
  uoff="unix:$dir/s2" toff="tcp:127.0.0.1:$port2"
  read -r -a off <<< "${CLIENT_ENV:-FERRY_REMOTE_FOLD=1}"  # the default client
  for _ in $(seq 300); do
    grep -q listening "$dir/unix2.log" && grep -q listening "$dir/tcp2.log" && break
    sleep 0.1
  done
fi
trap 'kill ${pids[*]} 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 300); do
  grep -q listening "$dir/unix.log" && grep -q listening "$dir/tcp.log" && break
  sleep 0.1
done
if [ "${CHECK:-0}" = 1 ]; then
  for a in "unix:$dir/s" "tcp:127.0.0.1:$port"; do
    name="$("$ferry" devices --remote "$a" | grep -o "$a/[A-Za-z0-9_]*" | grep -v '/CPU$' | head -1 || true)"
    [ -z "$name" ] && name="$a/CPU"
    echo "test-ops on $name: $("$ferry" test-ops --remote "$a" --device "$name" "${thr_args[@]}" | tail -1)"
  done
fi
tps() { # [ENV=V...] -- [--remote ADDR]: the t/s of the tg row
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local where=("$@")
  [ ${#where[@]} -eq 0 ] && where=("${dev_args[@]}")
  env "${envs[@]}" "$ferry" bench -m "$model" -p 0 -n "$n" -r "$r" ${BENCH_ARGS:-} "${thr_args[@]}" "${where[@]}" |
    awk -F'|' -v t="tg$n" '$7 ~ t { split($8, v, " "); print v[1] }'
}
row() {
  local cols=("$(tps --)" "$(tps -- --remote "unix:$dir/s")")
  [ "${OFF:-1}" != 0 ] && cols+=("$(tps "${off[@]}" -- --remote "$uoff")")
  cols+=("$(tps -- --remote "tcp:127.0.0.1:$port")")
  [ "${OFF:-1}" != 0 ] && cols+=("$(tps "${off[@]}" -- --remote "$toff")")
  echo "${cols[*]}"
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "model: $model; each run: ferry bench -p 0 -n $n -r $r ${BENCH_ARGS:-} ${thr_args[*]} [${dev_args[*]} | --remote ADDR]; servers: ${dev_args[*]} ${thr_args[*]}"
row >/dev/null  # warm-up: page cache, the servers' first sessions
rows=()
for _ in $(seq "$reps"); do rows+=("$(row)"); done
printf '%s\n' "${rows[@]}" | OFF="${OFF:-1}" python3 -c '
import os, statistics as st, sys
rows = [[float(x) for x in l.split()] for l in sys.stdin if l.strip()]
cols = list(zip(*rows))
names = ["local", "unix", "unix off", "tcp", "tcp off"]
if os.environ["OFF"] == "0":
    names = ["local", "unix", "tcp"]
by = dict(zip(names, cols))
for name in names:
    c = by[name]
    print(f"{name:9} t/s: " + ", ".join(f"{v:.1f}" for v in c) + f"  (median {st.median(c):.1f})")
def ratios(x, y):
    return [p / q for p, q in zip(x, y)]
for name in names[1:]:
    rs = ratios(by[name], by["local"])
    print(f"{name:9} / local: median of per-repetition ratios {st.median(rs):.3f} (" +
          ", ".join(f"{v:.2f}" for v in rs) + ")")
for t in ("unix", "tcp"):
    if t + " off" in by:
        rs = ratios(by[t], by[t + " off"])
        print(f"{t} on / off: median of per-repetition ratios {st.median(rs):.3f} (" +
              ", ".join(f"{v:.2f}" for v in rs) + ")")'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${PROFILE:-0}" = 1 ]; then
  for a in "unix:$dir/s" "tcp:127.0.0.1:$port"; do
    FERRY_REMOTE_STATS=1 "$ferry" bench -m "$model" -p 0 -n "$n" -r 1 ${BENCH_ARGS:-} "${thr_args[@]}" --remote "$a" 2>&1 |
      grep 'ferry remote' || true
  done
  sleep 0.5  # the sessions' profiles are printed when they end
  echo "server profiles (the last session of each is the FERRY_REMOTE_STATS run: warm-up + $n steps):"
  grep -h profile "$dir/unix.log" | tail -1 | sed 's/^/unix: /'
  grep -h profile "$dir/tcp.log" | tail -1 | sed 's/^/tcp: /'
fi

#!/usr/bin/env bash
# Tokens/s through the remote backend against local, measured side by side: starts a
# `ferry serve` on a unix socket and one on tcp loopback (same machine, CPU device), then runs
# `ferry bench` interleaved local / unix / tcp, REPS times, and prints each run, the medians,
# the ratio of the medians and the median of the per-repetition ratios (the VM's speed drifts
# over minutes, so a ratio within one repetition is the fairer comparison).
# Usage: bench/run-remote.sh MODEL [REPS] [N_GEN] [BENCH_REPS] [FERRY_BIN]
set -euo pipefail
model="$1"
reps="${2:-8}"
n="${3:-64}"
r="${4:-10}"
ferry="${5:-build/release/bin/ferry}"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
"$ferry" serve --listen "unix:$dir/s" -t 2 >"$dir/unix.log" 2>&1 &
unix_pid=$!
"$ferry" serve --listen "tcp:127.0.0.1:$port" -t 2 >"$dir/tcp.log" 2>&1 &
tcp_pid=$!
trap 'kill $unix_pid $tcp_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do
  grep -q listening "$dir/unix.log" && grep -q listening "$dir/tcp.log" && break
  sleep 0.1
done
tps() { # the t/s column of ferry bench's tg row
  "$ferry" bench -m "$model" -p 0 -n "$n" -t 2 -r "$r" "$@" | awk -F'|' -v t="tg$n" \
    '$7 ~ t { split($8, v, " "); print v[1] }'
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD)"
echo "model: $model; each run: ferry bench -p 0 -n $n -t 2 -r $r [--remote ADDR]; servers: -t 2"
# One unrecorded run each: page cache, server sessions' first allocations.
tps >/dev/null
tps --remote "unix:$dir/s" >/dev/null
tps --remote "tcp:127.0.0.1:$port" >/dev/null
local_runs=() unix_runs=() tcp_runs=()
for _ in $(seq "$reps"); do
  local_runs+=("$(tps)")
  unix_runs+=("$(tps --remote "unix:$dir/s")")
  tcp_runs+=("$(tps --remote "tcp:127.0.0.1:$port")")
done
python3 - "${local_runs[*]}" "${unix_runs[*]}" "${tcp_runs[*]}" <<'EOF'
import statistics as st
import sys
loc, uni, tcp = ([float(x) for x in a.split()] for a in sys.argv[1:4])
def show(name, xs):
    print(f"{name:6} t/s: " + ", ".join(f"{x:.1f}" for x in xs) + f"  (median {st.median(xs):.1f})")
show("local", loc)
show("unix", uni)
show("tcp", tcp)
for name, xs in (("unix", uni), ("tcp", tcp)):
    pairs = [x / l for l, x in zip(loc, xs)]
    print(f"{name} / local: ratio of medians {st.median(xs) / st.median(loc):.3f}, "
          f"median of per-repetition ratios {st.median(pairs):.3f} "
          f"({', '.join(f'{p:.2f}' for p in pairs)})")
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Tokens/s through an ivshmem window against local, host process to host process: starts
# `ferry serve --listen ivshmem:/dev/shm/...` and runs `ferry bench` interleaved local /
# window, REPS times; prints each run, the medians, the ratio of the medians and the median of
# the per-repetition ratios (the machine's speed drifts; within one repetition is fairer).
# Usage: bench/run-ivshmem.sh MODEL [REPS] [N_GEN] [BENCH_REPS] [FERRY_BIN]
set -euo pipefail
model="$1"
reps="${2:-8}"
n="${3:-64}"
r="${4:-10}"
ferry="${5:-build/release/bin/ferry}"
win="/dev/shm/ferry-bench-$$"
log="$(mktemp)"
"$ferry" serve --listen "ivshmem:$win,size=64M" -t 2 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$win" "$log"' EXIT
for _ in $(seq 50); do grep -q listening "$log" && break; sleep 0.1; done
tps() { # the t/s column of ferry bench's tg row
  "$ferry" bench -m "$model" -p 0 -n "$n" -t 2 -r "$r" "$@" | awk -F'|' -v t="tg$n" \
    '$7 ~ t { split($8, v, " "); print v[1] }'
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD)"
echo "model: $model; each run: ferry bench -p 0 -n $n -t 2 -r $r [--remote ivshmem:$win]; server: -t 2"
tps >/dev/null
tps --remote "ivshmem:$win" >/dev/null
local_runs=() win_runs=()
for _ in $(seq "$reps"); do
  local_runs+=("$(tps)")
  win_runs+=("$(tps --remote "ivshmem:$win")")
done
python3 - "${local_runs[*]}" "${win_runs[*]}" <<'PY'
import statistics as st
import sys
loc, win = ([float(x) for x in a.split()] for a in sys.argv[1:3])
def show(name, xs):
    print(f"{name:7} t/s: " + ", ".join(f"{x:.1f}" for x in xs) + f"  (median {st.median(xs):.1f})")
show("local", loc)
show("ivshmem", win)
pairs = [x / l for l, x in zip(loc, win)]
print(f"ivshmem / local: ratio of medians {st.median(win) / st.median(loc):.3f}, "
      f"median of per-repetition ratios {st.median(pairs):.3f} "
      f"({', '.join(f'{p:.2f}' for p in pairs)})")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

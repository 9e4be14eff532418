#!/usr/bin/env bash
# A/B of two ferry builds, local and through the remote backend, in the same minutes: starts a
# unix and a tcp `ferry serve -t 2` of each build, then REPS times runs, back to back, local B,
# local A, unix B, unix A, tcp B, tcp A with `ferry bench -m MODEL -p 0 -n N -t 2 -r R`, and
# prints the medians, each remote run's per-repetition ratio to its own build's local run, and
# B / A for local, unix and tcp. Used for the old-against-new tables in bench/results/ (A = an
# older commit built elsewhere, B = this tree).
# With PIN=1 (a machine with at least 10 cores), every process gets cores of its own, so that
# the scheduler's placement does not add to the spread: the clients (and the local runs) cores
# 0-1, the four servers cores 2-3, 4-5, 6-7 and 8-9.
# Usage: [R=10] [PIN=1] bench/ab-remote.sh FERRY_A FERRY_B MODEL [REPS] [N]
set -euo pipefail
a="$1" b="$2" model="$3" reps="${4:-8}" n="${5:-64}" r="${R:-10}"
on() { # CORES CMD...: CMD on those cores when PIN=1
  local cores="$1"
  shift
  if [ "${PIN:-0}" = 1 ]; then taskset -c "$cores" "$@"; else "$@"; fi
}
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
pids=()
on 2,3 "$b" serve --listen "unix:$dir/b" -t 2 >/dev/null 2>&1 & pids+=($!)
on 4,5 "$a" serve --listen "unix:$dir/a" -t 2 >/dev/null 2>&1 & pids+=($!)
on 6,7 "$b" serve --listen "tcp:127.0.0.1:$port" -t 2 >/dev/null 2>&1 & pids+=($!)
on 8,9 "$a" serve --listen "tcp:127.0.0.1:$((port + 1))" -t 2 >/dev/null 2>&1 & pids+=($!)
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
tps() { # BIN [--remote ADDR]: the t/s of the tg row
  local bin="$1"
  shift
  on 0,1 "$bin" bench -m "$model" -p 0 -n "$n" -t 2 -r "$r" "$@" | awk -F'|' -v t="tg$n" \
    '$7 ~ t { split($8, v, " "); print v[1] }'
}
run_all() {
  echo "$(tps "$b") $(tps "$a") $(tps "$b" --remote "unix:$dir/b") $(tps "$a" --remote "unix:$dir/a")" \
    "$(tps "$b" --remote "tcp:127.0.0.1:$port") $(tps "$a" --remote "tcp:127.0.0.1:$((port + 1))")"
}
run_all >/dev/null  # warm-up
rows=()
for _ in $(seq "$reps"); do rows+=("$(run_all)"); done
echo "A: $a; B: $b; model: $model; tg$n, -t 2 -r $r, PIN=${PIN:-0}; date: $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '%s\n' "${rows[@]}" | python3 -c '
import statistics as st, sys
rows = [[float(x) for x in l.split()] for l in sys.stdin if l.strip()]
cols = list(zip(*rows))
names = ["local B", "local A", "unix B", "unix A", "tcp B", "tcp A"]
for name, c in zip(names, cols):
    print(f"{name:8}", ", ".join(f"{v:.1f}" for v in c), f"(median {st.median(c):.1f})")
def ratio(x, y):
    return st.median([p / q for p, q in zip(x, y)])
for i, name in ((2, "unix B"), (3, "unix A"), (4, "tcp B"), (5, "tcp A")):
    print(f"{name} / local {name[-1]}: median of per-repetition ratios {ratio(cols[i], cols[i % 2]):.3f}")
print(f"B / A: local {ratio(cols[0], cols[1]):.3f}; unix {ratio(cols[2], cols[3]):.3f}; "
      f"tcp {ratio(cols[4], cols[5]):.3f}")'

#!/usr/bin/env bash
# A/B of two ferry builds through the remote backend, in the same minutes: starts a unix and a
# tcp `ferry serve -t 2` of each build, then REPS times runs, back to back, local (build B),
# unix B, unix A, tcp B, tcp A with `ferry bench -m MODEL -p 0 -n N -t 2 -r 10`, and prints
# each build's per-repetition ratios to local and B / A. Used for the old-against-new table in
# bench/results/remote.md (A = an older commit built elsewhere, B = this tree).
# Usage: bench/ab-remote.sh FERRY_A FERRY_B MODEL [REPS] [N]
set -euo pipefail
a="$1" b="$2" model="$3" reps="${4:-8}" n="${5:-64}"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
pids=()
"$b" serve --listen "unix:$dir/b" -t 2 >/dev/null 2>&1 & pids+=($!)
"$a" serve --listen "unix:$dir/a" -t 2 >/dev/null 2>&1 & pids+=($!)
"$b" serve --listen "tcp:127.0.0.1:$port" -t 2 >/dev/null 2>&1 & pids+=($!)
"$a" serve --listen "tcp:127.0.0.1:$((port + 1))" -t 2 >/dev/null 2>&1 & pids+=($!)
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
tps() { # BIN [--remote ADDR]: the t/s of the tg row
  local bin="$1"
  shift
  "$bin" bench -m "$model" -p 0 -n "$n" -t 2 -r 10 "$@" | awk -F'|' -v t="tg$n" \
    '$7 ~ t { split($8, v, " "); print v[1] }'
}
run_all() {
  echo "$(tps "$b") $(tps "$b" --remote "unix:$dir/b") $(tps "$a" --remote "unix:$dir/a")" \
    "$(tps "$b" --remote "tcp:127.0.0.1:$port") $(tps "$a" --remote "tcp:127.0.0.1:$((port + 1))")"
}
run_all >/dev/null  # warm-up
rows=()
for _ in $(seq "$reps"); do rows+=("$(run_all)"); done
echo "A: $a; B: $b; model: $model; tg$n, -t 2 -r 10; date: $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '%s\n' "${rows[@]}" | python3 -c '
import statistics as st, sys
rows = [[float(x) for x in l.split()] for l in sys.stdin if l.strip()]
cols = list(zip(*rows))
names = ["local (B)", "unix B", "unix A", "tcp B", "tcp A"]
for name, c in zip(names, cols):
    print(f"{name:10}", ", ".join(f"{v:.1f}" for v in c), f"(median {st.median(c):.1f})")
loc = cols[0]
for name, c in zip(names[1:], cols[1:]):
    print(f"{name} / local: median of per-repetition ratios {st.median([v / l for l, v in zip(loc, c)]):.3f}")
print(f"unix B / A {st.median([x / y for x, y in zip(cols[1], cols[2])]):.3f}; "
      f"tcp B / A {st.median([x / y for x, y in zip(cols[3], cols[4])]):.3f}")
'

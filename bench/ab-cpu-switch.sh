#!/usr/bin/env bash
# A/B of a CPU switch in one build: `ferry bench` with SWITCH=1 (A: default) and SWITCH=0 (B),
# alternating within each round so that both see the same minutes of a noisy VM. Prints one line
# per run and a table of per-round ratios A/B and their medians (markdown) at the end.
#
#   bench/ab-cpu-switch.sh SWITCH FERRY MODEL...
#   ROUNDS=3 THREADS=2 PP=512 TG=128 REPS=2   (defaults)
# e.g. bash bench/ab-cpu-switch.sh FERRY_CPU_REPACK build/release/bin/ferry build/models/1b-q4_0.gguf
set -euo pipefail
switch="$1"
ferry="$2"
shift 2
ROUNDS="${ROUNDS:-3}" THREADS="${THREADS:-2}" PP="${PP:-512}" TG="${TG:-128}" REPS="${REPS:-2}"
log="$(mktemp)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); ferry commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for m in "$@"; do
    name="$(basename "$m" .gguf)"
    for v in 1 0; do
      env "$switch=$v" "$ferry" bench -m "$m" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" 2>/dev/null |
        awk -F'|' -v n="$name" -v r="$r" -v s="$switch=$v" '$7 ~ /(pp|tg)[0-9]/ {gsub(/ /,"",$7); split($8,v," "); print r, n, s, $7, v[1]}' | tee -a "$log"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | test | $switch=1 t/s (rounds) | $switch=0 t/s (rounds) | ratios 1/0 | median ratio |"
echo "| --- | --- | --- | --- | --- | ---: |"
python3 - "$log" "$switch" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, model, s, test, tps = line.split()
    rows[(model, test)].setdefault(s.endswith("=1"), {})[int(r)] = float(tps)
for (model, test), d in rows.items():
    a, b = d.get(True, {}), d.get(False, {})
    rs = sorted(set(a) & set(b))
    ratios = [a[r] / b[r] for r in rs]
    fmt = lambda xs: ", ".join("%.2f" % x for x in xs)
    print("| %s | %s | %s | %s | %s | %.3f |" % (model, test, fmt([a[r] for r in rs]),
          fmt([b[r] for r in rs]), fmt(ratios), statistics.median(ratios) if ratios else float("nan")))
PY
rm -f "$log"

#!/usr/bin/env bash
# ferry against the peer (llama.cpp's llama-bench) on this machine's CPU, side by side: the
# same gen-model files, the same thread count, rounds alternating between the two programs so
# that both see the same minutes of a noisy VM. Prints one line per run and a table of medians
# and ratios (markdown) at the end.
#
#   bench/peer-cpu.sh PEER_LLAMA_BENCH FERRY MODEL... 
#   ROUNDS=3 THREADS=2 PP=512 TG=128 REPS=2   (defaults)
#
# The peer is built for measurement only, outside this repository, from the llama.cpp sources
# that PyPI's llama-cpp-python sdist vendors (nothing of it is copied here):
#   python3 -m venv /tmp/peer/venv && /tmp/peer/venv/bin/pip download --no-deps \
#     --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/peer && tar xzf ... -C /tmp/peer
#   cmake -S /tmp/peer/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/peer/build \
#     -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
#     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
#   cmake --build /tmp/peer/build -j2 --target llama-bench
set -euo pipefail
peer="$1"
ferry="$2"
shift 2
ROUNDS="${ROUNDS:-3}" THREADS="${THREADS:-2}" PP="${PP:-512}" TG="${TG:-128}" REPS="${REPS:-2}"
log="$(mktemp)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, flags: $(grep -o -w -E 'avx2|avx512f|avx512_vnni|avxvnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); ferry commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for m in "$@"; do
    name="$(basename "$m" .gguf)"
    # llama-bench: markdown rows "| model | size | params | backend | threads | test | t/s |".
    "$peer" -m "$m" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" 2>/dev/null |
      awk -F'|' -v n="$name" -v r="$r" '$7 ~ /(pp|tg)[0-9]/ {gsub(/ /,"",$7); split($8,v," "); print r, n, "peer", $7, v[1]}' | tee -a "$log"
    # ferry bench prints the same columns.
    "$ferry" bench -m "$m" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" 2>/dev/null |
      awk -F'|' -v n="$name" -v r="$r" '$7 ~ /(pp|tg)[0-9]/ {gsub(/ /,"",$7); split($8,v," "); print r, n, "ferry", $7, v[1]}' | tee -a "$log"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | test | peer t/s (rounds) | ferry t/s (rounds) | median ferry / peer (paired) |"
echo "| --- | --- | --- | --- | ---: |"
python3 - "$log" <<'EOF'
import sys, statistics, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, model, who, test, ts = line.split()
    runs[(model, test)].setdefault(who, {})[int(r)] = float(ts)
for (model, test), d in runs.items():
    p, f = d.get("peer", {}), d.get("ferry", {})
    ratios = [f[r] / p[r] for r in sorted(p) if r in f and p[r] > 0]
    fmt = lambda x: ", ".join(f"{x[r]:.1f}" for r in sorted(x))
    med = f"{statistics.median(ratios):.2f}" if ratios else "-"
    print(f"| {model} | {test} | {fmt(p)} | {fmt(f)} | {med} |")
EOF
rm -f "$log"

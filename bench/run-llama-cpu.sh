#!/usr/bin/env bash
# Records ferry bench on this machine's CPU (issue: llama runner benchmarks).
# Usage: bench/run-llama-cpu.sh [FERRY_BIN] [MODEL_DIR]  (MODEL_DIR holds gen-model outputs;
# they are made there when missing). Prints a markdown report to stdout.
set -euo pipefail
ferry="${1:-build/release/bin/ferry}"
models="${2:-/tmp/ferry-models}"
fixtures="$(dirname "$0")/../../shared/fixtures/tiny-llama"
mkdir -p "$models"
for t in q4_0 q8_0; do
  [ -f "$models/llama-3.2-1b-$t.gguf" ] ||
    "$ferry" gen-model --preset llama-3.2-1b --type "$t" -o "$models/llama-3.2-1b-$t.gguf" >&2
done
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD)"
echo
for enc in f32 q8_0 q4_0; do
  echo "\`$ferry bench -m tiny-llama-$enc.gguf -p 128 -n 64 -t 2 -r 10\`"
  echo
  "$ferry" bench -m "$fixtures/tiny-llama-$enc.gguf" -p 128 -n 64 -t 2 -r 10
  echo
done
for t in q4_0 q8_0; do
  echo "\`$ferry bench -m llama-3.2-1b-$t.gguf -p 512 -n 128 -t 2 -r 3\`"
  echo
  "$ferry" bench -m "$models/llama-3.2-1b-$t.gguf" -p 512 -n 128 -t 2 -r 3
  echo
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

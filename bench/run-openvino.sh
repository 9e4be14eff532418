#!/usr/bin/env bash
# OPENVINO:CPU against ferry's CPU backend, side by side in one run, on 1B gen-model files
# (issue 12). Usage: bench/run-openvino.sh [FERRY_BIN] [MODEL_DIR] [REPS]  (MODEL_DIR holds
# gen-model outputs, made there when missing). Prints a markdown report to stdout: for each
# file, the two devices interleaved (CPU, OpenVINO, CPU, OpenVINO...), each `ferry bench`
# printing tokens/s and the process's peak resident memory (and /usr/bin/time's wall time).
# Then the start of each: `ferry run -n 1` (first-token latency = load + prompt) on the CPU, on
# OPENVINO:CPU without a model cache, with an empty --cache-dir (cold) and with the same
# folder again (warm), FERRY_OPENVINO_TRACE=1 printing the compile time and resident memory.
# TYPES (default "q4_0 q8_0") and ROUNDS (default 2) narrow a run.
set -euo pipefail
ferry="${1:-build/release/bin/ferry}"
models="${2:-build/models}"
reps="${3:-3}"
types="${TYPES:-q4_0 q8_0}"
rounds="${ROUNDS:-2}"
mkdir -p "$models"
for t in q4_0 q8_0; do
  [ -f "$models/llama-3.2-1b-$t.gguf" ] ||
    "$ferry" gen-model --preset llama-3.2-1b --type "$t" -o "$models/llama-3.2-1b-$t.gguf" >&2
done
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD)"
echo
for t in $types; do
  m="$models/llama-3.2-1b-$t.gguf"
  echo "file: llama-3.2-1b-$t.gguf, $(($(stat -c %s "$m") / 1048576)) MiB"
  echo
  for round in $(seq "$rounds"); do
    for dev in CPU OPENVINO:CPU; do
      args=()
      [ "$dev" = CPU ] || args=(-d "$dev")
      echo "\`ferry bench -m llama-3.2-1b-$t.gguf -p 512 -n 128 -t 2 -r $reps ${args[*]}\` (round $round)"
      echo
      /usr/bin/time -f "wall %e s, peak RSS %M KiB" "$ferry" bench -m "$m" -p 512 -n 128 -t 2 -r "$reps" "${args[@]}" 2>&1
      echo
    done
  done
done
prompt="Hello there, how are you"
for t in $types; do
  m="$models/llama-3.2-1b-$t.gguf"
  cache="$(mktemp -d)"
  echo "start of llama-3.2-1b-$t.gguf: \`ferry run -m FILE -p \"$prompt\" -n 1 --temp 0 -t 2 ...\`"
  echo
  for mode in cpu none cold warm; do
    args=(-d OPENVINO:CPU)
    [ "$mode" = cpu ] && args=()
    [ "$mode" = cold ] || [ "$mode" = warm ] && args+=(--cache-dir "$cache")
    echo "- $mode: ${args[*]}"
    FERRY_OPENVINO_TRACE=1 /usr/bin/time -f "  wall %e s, peak RSS %M KiB" "$ferry" run -m "$m" \
      -p "$prompt" -n 1 --temp 0 -t 2 "${args[@]}" 2>&1 >/dev/null |
      grep -E "ferry run: (load|prompt)|model 1:|first inference|wall" | sed 's/^/  /'
  done
  echo "- cache folder: $(du -sh "$cache" | cut -f1)"
  rm -rf "$cache"
  echo
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

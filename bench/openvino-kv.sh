#!/usr/bin/env bash
# OPENVINO:CPU decode speed at a short and a long context, two ferry builds interleaved (A, B,
# A, B...) on the same minutes: the KV cache read in place (issue 12, item 6). Usage:
#   bench/openvino-kv.sh FERRY_A FERRY_B TINY_GGUF 1B_GGUF [ROUNDS]
# For each model, `ferry run` greedy with a short prompt and with a long one (the attended
# length of every decode step is the prompt plus the tokens so far), printing the decode
# tokens/s of each run and its peak RSS; then `ferry bench -p 512 -n 64` and `-p 16 -n 64` on
# the 1B file (tg there starts from an empty cache, so its context stays short; BENCH=0 skips
# them).
set -euo pipefail
a="$1"; b="$2"; tiny="$3"; big="$4"; rounds="${5:-2}"
here="$(cd "$(dirname "$0")/.." && pwd)"
# Long prompts: the start of docs/openvino.md (858 tiny-llama tokens, 530 tokens of the
# gen-model 1B vocabulary).
long_tiny="$(head -c 1500 "$here/docs/openvino.md" | tr '\n`|*' '    ')"
long_big="$(head -c 780 "$here/docs/openvino.md" | tr '\n`|*' '    ')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
one() {  # label binary model n prompt
  local out
  out="$(/usr/bin/time -f "peak RSS %M KiB" "$2" run -m "$3" -p "$5" -n "$4" --temp 0 -c 1024 -t 2 \
    -d OPENVINO:CPU 2>&1 >/dev/null)"
  echo "$1: $(echo "$out" | grep -E 'prompt [0-9]+ tokens' | sed 's/^ferry run: //'); $(echo "$out" | grep generated | sed 's/^ferry run: //'); $(echo "$out" | grep 'peak RSS')"
}
for round in $(seq "$rounds"); do
  for ctx in short long; do
    for build in A B; do
      bin="$a"; [ "$build" = B ] && bin="$b"
      if [ "$ctx" = short ]; then pt="Hello there"; pb="Hello there"; else pt="$long_tiny"; pb="$long_big"; fi
      one "round $round tiny-llama $ctx $build" "$bin" "$tiny" 128 "$pt"
      one "round $round 1B $ctx $build" "$bin" "$big" 32 "$pb"
    done
  done
done
[ "${BENCH:-1}" = 0 ] && exit 0
for p in 512 16; do
  for build in A B; do
    bin="$a"; [ "$build" = B ] && bin="$b"
    echo "\`ferry bench -m $(basename "$big") -p $p -n 64 -r 1 -t 2 -d OPENVINO:CPU\` ($build)"
    /usr/bin/time -f "peak RSS %M KiB" "$bin" bench -m "$big" -p "$p" -n 64 -r 1 -t 2 -d OPENVINO:CPU 2>&1 | grep -E '\|.*(pp|tg)|peak RSS'
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

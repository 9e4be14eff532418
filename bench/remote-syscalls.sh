#!/usr/bin/env bash
# System calls of a served decode step, counted (strace -c) rather than timed: a client's
# futex, recvmsg and sendmsg calls per step over tcp with FERRY_REMOTE_STRIPES stripes (default
# 2), against a CPU `ferry serve -t 1`, on a tiny model with the Llama 3 vocabulary (128,256
# logits: a 513 KB reply a step, striped as on the H200 host). Two runs (64 and 320 tokens),
# the difference per step, so that loading and warm-up cancel. On the 2-core VM wall times of a
# few microseconds are lost in its noise; counts are not.
#
#   bench/remote-syscalls.sh FERRY [FERRY_OLD ...]   (builds /tmp/ferry-v128k.gguf once; needs
#   strace: apt-get install -y strace)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(bench/tools/v128k-model.sh "$1")
count() { # FERRY N -> "futex F recvmsg R sendmsg S"
  local port=$((30000 + RANDOM % 20000)) out
  out=$(mktemp)
  "$1" serve --listen tcp:127.0.0.1:$port --device CPU -t 1 > /dev/null 2>&1 &
  local sp=$!
  sleep 1
  FERRY_REMOTE_STRIPES=${STRIPES:-2} strace -f -c -e trace=futex,recvmsg,sendmsg -o "$out" \
    "$1" bench -m $model -p 0 -n "$2" -r 1 -t 1 --remote tcp:127.0.0.1:$port > /dev/null 2>&1
  kill $sp; wait $sp 2> /dev/null || true
  awk '$NF == "futex" || $NF == "recvmsg" || $NF == "sendmsg" { n[$NF] = $4 }
       END { printf "%d %d %d\n", n["futex"], n["recvmsg"], n["sendmsg"] }' "$out"
  rm -f "$out"
}
for bin in "$@"; do
  a=$(count "$bin" 64) b=$(count "$bin" 320)
  echo "$a $b" | awk -v bin="$bin" '{ printf "%s: per step futex %.1f, recvmsg %.1f, sendmsg %.1f\n",
    bin, ($4 - $1) / 256, ($5 - $2) / 256, ($6 - $3) / 256 }'
done

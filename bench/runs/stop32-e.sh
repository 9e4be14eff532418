#!/usr/bin/env bash
# Run E (stop 32): why run D's tcp ratios (0.888 median, 4-stripe clients 0.65-0.94) fall
# short of what run C's logits reads promised (tcp 586.6 us median against unix 596.0): the
# profiled clients' whole line (means against medians, p90 and max of the logits read) for
# unix, tcp, tcp with 4 stripes and tcp to a cut server, two runs each, with the servers'
# piece traces; and the host's cores.
# .devE holds ferry.xz; carry [".devE"].
BIN=${BIN:-.devE}
source bench/runs/common.sh
lscpu | grep -E '^CPU\(s\)|Thread|Core|Socket|Model name|NUMA node\(s\)'
gen_models
serve_unix
serve_tcp 0 FERRY_SERVE_PIECE_TRACE=1
serve_tcp 1 FERRY_SERVE_PIECE_TRACE=1 FERRY_CUDA_PIECE_CUT=1
echo "=== $(date -u +%T) servers: $(servers_up)"
prof() { # NAME [FERRY_*=V ...] -- ARGS
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "$name: $(env "${envs[@]}" FERRY_SESSION_PROFILE=1 $F bench -m $Q -p 0 -n 128 -r 1 "$@" 2>&1 | grep -o 'per step us.*' | head -1)"
}
for r in 1 2; do
  prof local FERRY_X=1 -- --device CUDA0
  prof unix FERRY_X=1 -- --remote unix:$SD/u
  prof tcp FERRY_X=1 -- --remote tcp:127.0.0.1:$P
  prof tcp-4 FERRY_REMOTE_STRIPES=4 -- --remote tcp:127.0.0.1:$P
  prof tcp-cut FERRY_X=1 -- --remote tcp:127.0.0.1:$((P + 1))
done
echo "=== $(date -u +%T) server traces"
for k in 0 1; do echo "--- tcp server $k"; grep -h "progressive replies" $SD/t$k.log | sed -e 's/^ferry serve: //' | cut -c1-300; done
echo "=== $(date -u +%T) done"

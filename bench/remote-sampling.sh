#!/usr/bin/env bash
# Sampled generation (`ferry run`, llama.cpp's default sampler, and greedy) on a tiny model with
# the Llama 3 vocabulary (128,256 logits a token), local and through `ferry serve` over unix
# and tcp, with the session reading whole rows of logits (FERRY_DEVICE_TOPK=0) or only the
# sampler's candidates (the default: TOP_K on the serving device, 40 candidates or 1). Every
# process pinned to one vCPU (taskset -c 1: on the 2-core VM, unpinned wake-ups across vCPUs
# vary more than what is measured), ROUNDS rounds of every variant in turn; prints each run's
# tokens/s and the medians.
#
#   bench/remote-sampling.sh FERRY [ROUNDS=5] [N=256]
set -euo pipefail
cd "$(dirname "$0")/.."
ferry=$1 rounds=${2:-5} n=${3:-256}
model=$(bench/tools/v128k-model.sh "$ferry")
dir=$(mktemp -d)
port=$((30000 + RANDOM % 20000))
taskset -c 1 "$ferry" serve --listen unix:$dir/s --device CPU -t 1 > /dev/null 2>&1 &
us=$!
taskset -c 1 "$ferry" serve --listen tcp:127.0.0.1:$port --device CPU -t 1 > /dev/null 2>&1 &
ts=$!
trap 'kill $us $ts 2> /dev/null; rm -rf $dir' EXIT
sleep 1
res=$dir/results
for r in $(seq "$rounds"); do
  for sampler in "default" "greedy"; do
    [ $sampler = greedy ] && sargs="--temp 0" || sargs=""
    for where in local unix tcp; do
      case $where in
        local) rargs="" ;;
        unix) rargs="--remote unix:$dir/s" ;;
        tcp) rargs="--remote tcp:127.0.0.1:$port" ;;
      esac
      for topk in 0 1; do
        tps=$(FERRY_DEVICE_TOPK=$topk taskset -c 1 "$ferry" run -m $model -p "Once upon a time" \
          -n "$n" -t 1 $sargs $rargs 2>&1 > /dev/null |
          sed -n 's/.*generated \([0-9]*\) tokens in .* (\([0-9.]*\) tokens\/s).*/\1 \2/p')
        echo "$r $sampler $where $topk $tps" | tee -a $res
      done
    done
  done
done
echo "medians (tokens/s): sampler where | whole rows | candidates | ratio"
for sampler in default greedy; do
  for where in local unix tcp; do
    a=$(awk -v s=$sampler -v w=$where '$2 == s && $3 == w && $4 == 0 { print $6 }' $res | sort -g |
      awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    b=$(awk -v s=$sampler -v w=$where '$2 == s && $3 == w && $4 == 1 { print $6 }' $res | sort -g |
      awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    echo "$sampler $where | $a | $b | $(echo "$b $a" | awk '{ printf "%.2f", $1 / $2 }')"
  done
done

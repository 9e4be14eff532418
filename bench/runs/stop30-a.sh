#!/usr/bin/env bash
# Run A (stop 30): progressive results over tcp. The new tests (pieces against the usual read;
# served tcp logits against local with pieces 4 / 0 / 16), the graph tests around them, then
# 1B Q4_0 and F16 tg128 side by side: local, unix, and tcp servers with FERRY_CUDA_PIECES
# 0 (off), 2, 4 (the default), 8 and 16; then one profiled client per tcp server (the logits
# read's median).
# .devA holds ferry.xz and test_cuda.xz; carry [".devA"].
BIN=.devA
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
FERRY_TEST_BIN=$F timeout 240 $TC --gtest_filter='*Progressive*:*ServedTcp*:*SameLogitsEveryRun*:*ReplayedGraph*:*AlternatingGraphs*:*InPlaceChanges*:*StagedInputs*:*FusedKernelsNever*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|tests ran|SKIPPED|Expected|Which is|step" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) servers"
d=$(mktemp -d)
$F serve --listen unix:$d/u --device CUDA0 > $d/u.log 2>&1 &
pids=($!)
P=$((21000 + RANDOM % 20000))
for k in 0 2 4 8 16; do
  FERRY_CUDA_PIECES=$k $F serve --listen tcp:127.0.0.1:$((P + k)) --device CUDA0 > $d/t$k.log 2>&1 &
  pids+=($!)
done
trap 'kill ${pids[*]} 2>/dev/null' EXIT
sleep 3
grep -h listening $d/*.log
for model in $Q $H; do
  echo "--- $(basename $model): local unix tcp0 tcp2 tcp4 tcp8 tcp16"
  bt $model --device CUDA0 > /dev/null  # warm-up
  for k in 0 4; do bt $model --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
  rounds=3
  [ $model = $H ] && rounds=2
  for r in $(seq $rounds); do
    row="$(bt $model --device CUDA0) $(bt $model --remote unix:$d/u)"
    for k in 0 2 4 8 16; do row="$row $(bt $model --remote tcp:127.0.0.1:$((P + k)))"; done
    echo "$row"
  done
done
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
for a in unix:$d/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8)); do
  echo "$a: $(FERRY_SESSION_PROFILE=1 $F bench -m $Q -p 0 -n 128 -r 1 --remote $a 2>&1 | grep -o 'compute call.*' | head -1)"
done
echo "test-ops over tcp (pieces 4): $($F test-ops --remote tcp:127.0.0.1:$((P + 4)) --device tcp:127.0.0.1:$((P + 4))/CUDA0 | tail -1)"
echo "=== $(date -u +%T) done"

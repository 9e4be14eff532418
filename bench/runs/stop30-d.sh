#!/usr/bin/env bash
# Run D (stop 30): the two forms of progressive results side by side. Counts: one launch whose
# blocks count each piece (the block's last warp fences once), a second stream waiting on the
# counts (cuStreamWaitValue32). Launches (FERRY_CUDA_PIECE_LAUNCHES=1): one launch per piece.
# The new tests under both forms; what each costs the GPU with no reader (local tg128,
# FERRY_CUDA_PIECES forces pieces on a local backend); then 1B Q4_0 and F16 tg128 side by
# side: local, unix, tcp with pieces off, counts 4 / 8, launches 4 / 8; then profiled clients.
# .devD holds ferry.xz and test_cuda.xz; carry [".devD"].
BIN=.devD
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda (counts, then launches)"
FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*ServedTcp*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda.txt | head -20
FERRY_CUDA_PIECE_LAUNCHES=1 FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*ServedTcp*' > $OUT/test_cuda2.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda2.txt | head -20
wait
echo "=== $(date -u +%T) local tg128, no reader: default | counts 4 | counts 8 | launches 4"
L=FERRY_CUDA_PIECE_LAUNCHES=1
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4 $L)  f16: $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=4) $(R=3 tg $H 128 FERRY_CUDA_PIECES=4 $L)"
done
echo "=== $(date -u +%T) servers"
d=$(mktemp -d)
$F serve --listen unix:$d/u --device CUDA0 > $d/u.log 2>&1 &
pids=($!)
P=$((21000 + RANDOM % 20000))
for k in 0 4 8; do
  FERRY_CUDA_PIECES=$k $F serve --listen tcp:127.0.0.1:$((P + k)) --device CUDA0 > $d/t$k.log 2>&1 &
  pids+=($!)
  FERRY_CUDA_PIECES=$k $L $F serve --listen tcp:127.0.0.1:$((P + 20 + k)) --device CUDA0 > $d/l$k.log 2>&1 &
  pids+=($!)
done
trap 'kill ${pids[*]} 2>/dev/null' EXIT
sleep 3
grep -h listening $d/*.log | wc -l
for model in $Q $H; do
  echo "--- $(basename $model): local unix tcp0 counts4 counts8 launches4 launches8"
  bt $model --device CUDA0 > /dev/null  # warm-up
  for k in 0 4 24; do bt $model --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
  rounds=3
  [ $model = $H ] && rounds=2
  for r in $(seq $rounds); do
    row="$(bt $model --device CUDA0) $(bt $model --remote unix:$d/u)"
    for k in 0 4 8 24 28; do row="$row $(bt $model --remote tcp:127.0.0.1:$((P + k)))"; done
    echo "$row"
  done
done
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
for a in unix:$d/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8)) tcp:127.0.0.1:$((P + 24)) tcp:127.0.0.1:$((P + 28)); do
  echo "$a: $(FERRY_SESSION_PROFILE=1 $F bench -m $Q -p 0 -n 128 -r 1 --remote $a 2>&1 | grep -o 'medians.*' | head -1)"
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run E (stop 30): progressive results as one launch per piece (the form kept). The new
# tests; what the cuts cost the GPU with no reader (local tg128, FERRY_CUDA_PIECES forces
# pieces on a local backend; FERRY_CUDA_PIECE_COPIES=0 cuts without copying); then 1B Q4_0
# and F16 tg128 side by side: local, unix, tcp with pieces off, 2, 4 (the default), 8, and 4
# on one connection; then profiled clients.
# .devE holds ferry.xz and test_cuda.xz; carry [".devE"].
BIN=.devE
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*ServedTcp*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda.txt | head -20
wait
echo "=== $(date -u +%T) local tg128, no reader: default | 4 | 4 not copied | 2 | 8  (f16: default | 4 | 8)"
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4 FERRY_CUDA_PIECE_COPIES=0) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=2) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8)  f16: $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=4) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8)"
done
echo "=== $(date -u +%T) servers"
d=$(mktemp -d)
$F serve --listen unix:$d/u --device CUDA0 > $d/u.log 2>&1 &
pids=($!)
P=$((21000 + RANDOM % 20000))
for k in 0 2 4 8; do
  FERRY_CUDA_PIECES=$k $F serve --listen tcp:127.0.0.1:$((P + k)) --device CUDA0 > $d/t$k.log 2>&1 &
  pids+=($!)
done
FERRY_SERVE_PIECE_STRIPES=0 $F serve --listen tcp:127.0.0.1:$((P + 1)) --device CUDA0 > $d/t1.log 2>&1 &
pids+=($!)
trap 'kill ${pids[*]} 2>/dev/null' EXIT
sleep 3
grep -h listening $d/*.log | wc -l
for model in $Q $H; do
  echo "--- $(basename $model): local unix tcp0 tcp2 tcp4 tcp8 tcp4-one-connection"
  bt $model --device CUDA0 > /dev/null  # warm-up
  for k in 0 4; do bt $model --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
  rounds=4
  [ $model = $H ] && rounds=2
  for r in $(seq $rounds); do
    row="$(bt $model --device CUDA0) $(bt $model --remote unix:$d/u)"
    for k in 0 2 4 8 1; do row="$row $(bt $model --remote tcp:127.0.0.1:$((P + k)))"; done
    echo "$row"
  done
done
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
for a in unix:$d/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 2)) tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8)); do
  echo "$a: $(FERRY_SESSION_PROFILE=1 $F bench -m $Q -p 0 -n 128 -r 1 --remote $a 2>&1 | grep -o 'medians.*' | head -1)"
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run D (stop 32): the candidate (flagged mirror + interleaved stripes) with every test_cuda
# test and every tiny-llama fixture, then the served ratios in more rounds than runs A-C:
# 1B Q4_0, eight rounds side by side: local, unix, tcp to mirror servers (the default client:
# 2 stripes on this host), the same with 4-stripe clients, tcp to cut servers
# (FERRY_CUDA_PIECE_CUT=1); F16 three rounds; the per-round ratios and their medians.
# .devD holds ferry.xz, test_cuda.xz and fx.tar.xz; carry [".devD"].
BIN=${BIN:-.devD}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
FERRY_TEST_BIN=$F timeout 330 $TC > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|PASSED|tests ran|SKIPPED|op cases" $OUT/test_cuda.txt | head -20
wait
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_PIECE_CUT=1
echo "=== $(date -u +%T) servers: $(servers_up); columns: local unix tcp tcp-4-stripes tcp-cut"
for model in $Q $H; do
  rounds=8
  [ $model = $H ] && rounds=3
  bt $model --device CUDA0 > /dev/null
  bt $model --remote tcp:127.0.0.1:$P > /dev/null
  bt $model --remote tcp:127.0.0.1:$((P + 1)) > /dev/null
  for r in $(seq $rounds); do
    echo "$(bt $model --device CUDA0) $(bt $model --remote unix:$SD/u) $(bt $model --remote tcp:127.0.0.1:$P) $(FERRY_REMOTE_STRIPES=4 bt $model --remote tcp:127.0.0.1:$P) $(bt $model --remote tcp:127.0.0.1:$((P + 1)))"
  done | tee $SD/rows
  echo "--- $(basename $model): per-round ratios to local (unix tcp tcp-4 tcp-cut), then medians"
  awk '{ printf "%.3f %.3f %.3f %.3f\n", $2/$1, $3/$1, $4/$1, $5/$1 }' $SD/rows | tee $SD/ratios
  for c in 1 2 3 4; do sort -n -k$c,$c $SD/ratios | awk -v c=$c '{ v[NR] = $c } END { printf "%s ", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; done
  echo
done
echo "=== $(date -u +%T) done"

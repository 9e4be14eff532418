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
serve_unix
for k in 0 2 4 8 16; do serve_tcp $k FERRY_CUDA_PIECES=$k; done
servers_up
side_by_side "tcp0 tcp2 tcp4 tcp8 tcp16" "0 4" "0 2 4 8 16"
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'compute call.*' unix:$SD/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8))
echo "test-ops over tcp (pieces 4): $($F test-ops --remote tcp:127.0.0.1:$((P + 4)) --device tcp:127.0.0.1:$((P + 4))/CUDA0 | tail -1)"
echo "=== $(date -u +%T) done"

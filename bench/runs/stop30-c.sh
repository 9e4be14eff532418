#!/usr/bin/env bash
# Run C (stop 30): progressive results counted by the product kernel itself (one launch;
# a second stream waits on the counts with cuStreamWaitValue32), striped replies. The new
# tests and the product and graph tests around the changed kernel; what the pieces cost the
# GPU with no reader (local tg128, FERRY_CUDA_PIECES forces them on a local backend); then 1B Q4_0 and F16
# tg128 side by side: local, unix, tcp servers with pieces off (0), 2, 4 (the default), 8, 16,
# and 4 on one connection (FERRY_SERVE_PIECE_STRIPES=0); then profiled clients.
# .devC holds ferry.xz and test_cuda.xz; carry [".devC"].
BIN=.devC
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
FERRY_TEST_BIN=$F timeout 240 $TC --gtest_filter='*Progressive*:*ServedTcp*:*ReplayedGraph*:*AlternatingGraphs*:*InPlaceChanges*:*StagedInputs*:*FusedKernelsNever*:*StreamProducts*:*WideStream*:*FoldedNorm*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|tests ran|SKIPPED|Expected|Which is|step" $OUT/test_cuda.txt | head -40
wait
echo "=== $(date -u +%T) local tg128, no reader: default | FERRY_CUDA_PIECES=4 | =8 (f16: default | 4)"
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8)  f16: $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=4)"
done
echo "=== $(date -u +%T) servers"
serve_unix
for k in 0 2 4 8 16; do serve_tcp $k FERRY_CUDA_PIECES=$k; done
serve_tcp 1 FERRY_SERVE_PIECE_STRIPES=0
servers_up
side_by_side "tcp0 tcp2 tcp4 tcp8 tcp16 tcp4-one-connection" "0 4" "0 2 4 8 16 1"
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'medians.*' unix:$SD/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8)) tcp:127.0.0.1:$((P + 1))
echo "test-ops over tcp (pieces 4): $($F test-ops --remote tcp:127.0.0.1:$((P + 4)) --device tcp:127.0.0.1:$((P + 4))/CUDA0 | tail -1)"
echo "=== $(date -u +%T) done"

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
serve_unix
for k in 0 4 8; do
  serve_tcp $k FERRY_CUDA_PIECES=$k
  serve_tcp $((20 + k)) FERRY_CUDA_PIECES=$k $L
done
servers_up
side_by_side "tcp0 counts4 counts8 launches4 launches8" "0 4 24" "0 4 8 24 28"
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'medians.*' unix:$SD/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8)) tcp:127.0.0.1:$((P + 24)) tcp:127.0.0.1:$((P + 28))
echo "=== $(date -u +%T) done"

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
serve_unix
for k in 0 2 4 8; do serve_tcp $k FERRY_CUDA_PIECES=$k; done
serve_tcp 1 FERRY_SERVE_PIECE_STRIPES=0
servers_up
side_by_side "tcp0 tcp2 tcp4 tcp8 tcp4-one-connection" "0 4" "0 2 4 8 1" 4
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'medians.*' unix:$SD/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 2)) tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8))
echo "=== $(date -u +%T) done"

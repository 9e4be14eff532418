#!/usr/bin/env bash
# Run G (stop 30): a third form of progressive results (FERRY_CUDA_PIECE_SIGNAL=1): no graph
# branches; launch c + 1 stores piece c's flag once past its wait, and the reader copies each
# piece itself (the last once the stream is idle). The new tests under it and under the
# default, the early-attention test (its model helper is new); what each form costs the GPU
# with no reader; then 1B Q4_0 and F16 tg128 side by side: local, unix, tcp with pieces off,
# the default (8 copied pieces), signal 4 / 8 / 16; then profiled clients.
# .devG holds ferry.xz and test_cuda.xz; carry [".devG"].
BIN=.devG
source bench/runs/common.sh
gen_models &
S=FERRY_CUDA_PIECE_SIGNAL=1
echo "=== $(date -u +%T) test_cuda (signal, then the default)"
env $S FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*ServedTcp*' > $OUT/test_cuda.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step" $OUT/test_cuda.txt | head -20
FERRY_TEST_BIN=$F timeout 120 $TC --gtest_filter='*Progressive*:*EarlyAttention*' > $OUT/test_cuda2.txt 2>&1
grep -E "FAILED|Failure|OK \]|PASSED|Expected|Which is|step|early" $OUT/test_cuda2.txt | head -20
wait
echo "=== $(date -u +%T) local tg128, no reader: default | copies 8 | signal 8 | signal 4  (f16: default | copies 8 | signal 8)"
for r in 1 2; do
  echo "q4_0: $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8 $S) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=4 $S)  f16: $(R=3 tg $H 128) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8) $(R=3 tg $H 128 FERRY_CUDA_PIECES=8 $S)"
done
echo "=== $(date -u +%T) servers"
serve_unix
serve_tcp 0 FERRY_CUDA_PIECES=0
serve_tcp 1
for k in 4 8 16; do serve_tcp $k FERRY_CUDA_PIECES=$k $S; done
servers_up
side_by_side "tcp0 copies8 signal4 signal8 signal16" "0 1 8" "0 1 4 8 16"
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'medians.*' tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 1)) tcp:127.0.0.1:$((P + 4)) tcp:127.0.0.1:$((P + 8))
echo "=== $(date -u +%T) done"

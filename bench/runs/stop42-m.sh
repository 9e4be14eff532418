#!/usr/bin/env bash
# Stop 42, call M: the committed form of call L's change (.dev8): EarlyAttentionLoadsGiveTheSameBits
# now runs four forms (rows after the wait; before it with the indices after; the indices
# before it too, the default; and the late trigger) and asks every default early launch to
# read its indices before the wait; with the other decode and replay tests and the f16, q8_0
# and q4_0 oracle cases.
# Carry [".dev8"].
BIN=.dev8 source bench/runs/common.sh
echo "=== $(date -u +%T) test_cuda"
tests "*EarlyAttention*:*LongDecode*:*Chunked*:*SameLogits*:*Replayed*:*Staged*:*InPlace*:*Alternating*:*CudaOracle*/f16:*CudaOracle*/q8_0:*CudaOracle*/q4_0" $(cap 150)
grep "early attention launches" $OUT/test_cuda.*.txt
echo "=== $(date -u +%T) done at ${SECONDS}s"

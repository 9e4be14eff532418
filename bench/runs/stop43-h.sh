#!/usr/bin/env bash
# Stop 43, call H: the tests of d641b72 (the L2 ask on by default) that calls D-E did not run:
# those reading the f32 file (F32WithF32Cache, FusedDecodeMatchesUnfused, the declined-op
# fallback, the f32 oracle case) and ProgressiveResultsGiveTheUsualBytes (147 s in stop 40;
# calls D-E stopped it at 115 and 150 s). Carry [".dev7"] (call C's binaries, the f32 fixtures).
BIN=.dev7 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== $(date -u +%T) f32"
tests "*F32WithF32Cache*:*FusedDecodeMatchesUnfused*:*DeclinedOp*:*/f32" $(cap 120)
echo "=== $(date -u +%T) progressive"
tests "*ProgressiveResults*" $(cap 260)
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Run E of stop 41: the tests that read the f32 fixture, on the new defaults (run D had the
# rest). Carry [".devJ"] (test_cuda.xz alone; fx.tar.xz and fx2.tar.xz: every fixture).
BIN=${BIN:-.devJ}
xz -dc $BIN/test_cuda.xz > /tmp/test_cuda && chmod +x /tmp/test_cuda
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  mkdir -p $d
  for x in fx fx2; do tar -C $d -xJf "$BIN/$x.tar.xz"; done
done
mkdir -p /work/main
echo "=== $(date -u +%T) test_cuda"
timeout ${LIMIT:-400} /tmp/test_cuda --gtest_filter="${FILTER:-*F32WithF32Cache*:*FusedDecodeMatchesUnfused*:*/f32}" > $OUT/test_cuda.e.txt 2>&1
echo "rc $?"
grep -E "^\[  |FAILED|PASSED|SKIPPED|nmse|KL" $OUT/test_cuda.e.txt | head -40
grep -B2 -A12 "Failure" $OUT/test_cuda.e.txt | head -40
echo "=== $(date -u +%T) done at ${SECONDS}s"

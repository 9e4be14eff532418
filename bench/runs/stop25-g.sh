#!/usr/bin/env bash
# Run G (stop 25): the test_cuda cases that need the q5_k_m, q6_k and q4_1 fixtures.
# .devF as in stop25-f.sh, fx/ with reference.json, case*.logits.f32 and those three ggufs.
set -u
M=.devF
xz -dc $M/test_cuda.xz > /tmp/test_cuda && chmod +x /tmp/test_cuda
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do mkdir -p $d && cp $M/fx/* $d/ 2>/dev/null; done
timeout 300 /tmp/test_cuda --gtest_filter='*KQuant*:*RingDecode*:Encodings/CudaOracle.*/q4_1:Encodings/CudaOracle.*/q5_k_m:Encodings/CudaOracle.*/q6_k:*SameLogits*' > $OUT/test_cuda.txt 2>&1
grep -E "^\[ cuda|OK \]|FAILED|Failure|Expected|Which is|PASSED" $OUT/test_cuda.txt | head -40

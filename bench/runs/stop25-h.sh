#!/usr/bin/env bash
# Run H (stop 25, review): the staged-input tests and a tg128 after the fallback paths of
# set_tensors_async stopped issuing on their own.
set -u
M=.devbin
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do mkdir -p $d && cp $M/fx/* $d/ 2>/dev/null; done
Q=/tmp/llama-1b-q4_0.gguf
$M/ferry gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
timeout 200 $M/test_cuda --gtest_filter='*Staged*:*ReplayedGraph*:*InPlace*:*Alternating*:*SameLogits*:*LongDecode*:Encodings/CudaOracle.*/q8_0:Encodings/CudaOracle.*/q4_0' 2>&1 | grep -E "OK \]|FAILED|Failure|PASSED"
for r in 1 2; do $M/ferry bench -m $Q --device CUDA0 -p 0 -n 128 -r 5 2>&1 | grep tg128; done

#!/usr/bin/env bash
# Run F (stop 25): every test_cuda test with the f32 fixture carried (binaries xz-compressed to
# fit the 64 MiB carry), test-ops, tg128, served rounds.
# .devF holds ferry.xz and test_cuda.xz (xz -6 of bench/build-for-device.sh's binaries) and fx/ (the
# fixtures the tests read); run from the repository root with carry [".devF"].
set -u
M=.devF
xz -dc $M/ferry.xz > /tmp/ferry && xz -dc $M/test_cuda.xz > /tmp/test_cuda && chmod +x /tmp/ferry /tmp/test_cuda
F=/tmp/ferry
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do mkdir -p $d && cp $M/fx/* $d/ 2>/dev/null; done
Q=/tmp/llama-1b-q4_0.gguf; H=/tmp/llama-1b-f16.gguf; T=$M/fx/tiny-llama-q8_0.gguf
$F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
$F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1
tg() { # MODEL N [ARGS/ENV...]: t/s
  local m=$1 n=$2; shift 2
  local envs=() args=()
  for a in "$@"; do if [[ $a == FERRY_* ]]; then envs+=("$a"); else args+=("$a"); fi; done
  env "${envs[@]}" $F bench -m $m --device CUDA0 -p 0 -n $n -r ${R:-5} "${args[@]}" 2>&1 | grep "tg$n" | awk -F'|' '{print $8}'
}
echo "=== $(date -u +%T) test_cuda, every test (the q4_1, q5_k_m, q6_k fixtures not carried)"
timeout 400 /tmp/test_cuda --gtest_filter='-Encodings/CudaOracle.*/q4_1:Encodings/CudaOracle.*/q5_k_m:Encodings/CudaOracle.*/q6_k' > $OUT/test_cuda.txt 2>&1
grep -E "^\[ cuda|FAILED|Failure|PASSED|tests ran" $OUT/test_cuda.txt | grep -v -i "folded\|ring\|block-lane\|raw" | head -60
echo "=== $(date -u +%T) test-ops CUDA0"
$F test-ops --backend CUDA0 > $OUT/ops.txt 2>&1; grep -E "FAIL" $OUT/ops.txt | head; tail -1 $OUT/ops.txt
echo "=== $(date -u +%T) tg128"
for r in 1 2 3; do echo "q4_0: $(tg $Q 128)"; done
echo "f16: $(tg $H 128)"; echo "f16 FNORM=1: $(tg $H 128 FERRY_CUDA_MV_FNORM=1)"; echo "f16: $(tg $H 128)"; echo "f16 FNORM=1: $(tg $H 128 FERRY_CUDA_MV_FNORM=1)"
echo "tiny: $(tg $T 128)"
echo "=== $(date -u +%T) served rounds"
DEVICE=CUDA0 OFF=0 CHECK=1 bash bench/serve-step.sh $F $Q 5 128 > $OUT/serve.log 2>&1
grep -E "median|ratio|test-ops" $OUT/serve.log | head -30
echo "=== $(date -u +%T) done"

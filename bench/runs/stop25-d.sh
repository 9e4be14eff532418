#!/usr/bin/env bash
# Run D (stop 25): staged inputs in the captured graph (FERRY_CUDA_STAGE, on by default), then
# the served step profiled. Binaries from `bash bench/build-for-device.sh .devbin`, fixtures in
# .devbin/fx (reference.json, case*.logits.f32, tiny-llama f16/q8_0/q4_0/q4_k_m); run from the
# repository root on the device machine with carry [".devbin"]; $OUT collects the logs.
set -u
M=.devbin
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do mkdir -p $d && cp $M/fx/* $d/ 2>/dev/null; done
Q=/tmp/llama-1b-q4_0.gguf; H=/tmp/llama-1b-f16.gguf; T=$M/fx/tiny-llama-q8_0.gguf
$M/ferry gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
$M/ferry gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1
tg() { # MODEL N [ARGS/ENV...]: t/s
  local m=$1 n=$2; shift 2
  local envs=() args=()
  for a in "$@"; do if [[ $a == FERRY_* ]]; then envs+=("$a"); else args+=("$a"); fi; done
  env "${envs[@]}" $M/ferry bench -m $m --device CUDA0 -p 0 -n $n -r ${R:-5} "${args[@]}" 2>&1 | grep "tg$n" | awk -F'|' '{print $8}'
}
echo "=== $(date -u +%T) test_cuda"
timeout 240 $M/test_cuda --gtest_filter='*Staged*:*ReplayedGraph*:*Chunked*:*LongDecode*:*Alternating*:*SameLogits*:*OutOfRange*:*FusedDecode*:*FoldedNorm*:Encodings/CudaOracle.*/q8_0:Encodings/CudaOracle.*/q4_0:Encodings/CudaOracle.*/f16:Encodings/CudaOracle.*/q4_k_m' > $OUT/test_cuda.txt 2>&1
grep -E "^\[ cuda|OK \]|FAILED|Failure|Expected|Which is|PASSED|nmse" $OUT/test_cuda.txt | grep -v "^\[ cuda.*folded" | head -60
echo "=== $(date -u +%T) test-ops CUDA0"
$M/ferry test-ops --backend CUDA0 > $OUT/ops.txt 2>&1; grep -E "FAIL" $OUT/ops.txt | head; tail -1 $OUT/ops.txt
echo "=== $(date -u +%T) tg128 side by side: default (staged inputs) vs FERRY_CUDA_STAGE=0"
for r in 1 2 3; do
  echo "q4_0 default: $(tg $Q 128)"; echo "q4_0 STAGE=0: $(tg $Q 128 FERRY_CUDA_STAGE=0)"
done
for r in 1 2; do echo "f16 default: $(tg $H 128)"; echo "f16 STAGE=0: $(tg $H 128 FERRY_CUDA_STAGE=0)"; done
for r in 1 2; do echo "tiny default: $(tg $T 128)"; echo "tiny STAGE=0: $(tg $T 128 FERRY_CUDA_STAGE=0)"; done
echo "q4_0 tg512 default: $(R=2 tg $Q 512)"; echo "q4_0 tg512 STAGE=0: $(R=2 tg $Q 512 FERRY_CUDA_STAGE=0)"
echo "=== $(date -u +%T) session profile default / STAGE=0"
FERRY_CUDA_GRAPH_STATS=1 FERRY_SESSION_PROFILE=1 $M/ferry bench -m $Q --device CUDA0 -p 0 -n 128 -r 3 > $OUT/prof-default.txt 2>&1; grep -E "profile|stats|tg128" $OUT/prof-default.txt
FERRY_CUDA_STAGE=0 FERRY_CUDA_GRAPH_STATS=1 FERRY_SESSION_PROFILE=1 $M/ferry bench -m $Q --device CUDA0 -p 0 -n 128 -r 3 > $OUT/prof-stage0.txt 2>&1; grep -E "profile|stats|tg128" $OUT/prof-stage0.txt
echo "=== $(date -u +%T) served, profiled (full log in \$OUT)"
FERRY_CUDA_GRAPH_STATS=1 DEVICE=CUDA0 OFF=0 CHECK=1 PROFILE=1 bash bench/serve-step.sh $M/ferry $Q 3 128 > $OUT/serve.log 2>&1
grep -E "median|ratio|test-ops|profile" $OUT/serve.log | head -30
echo "=== $(date -u +%T) done"

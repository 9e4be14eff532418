#!/usr/bin/env bash
# Run E (stop 25): the compact graph key (FERRY_CUDA_COMPACT_KEY) and the remote client's
# shorter tensor images; session profiles of local and served steps. Binaries and fixtures as
# in stop25-d.sh.
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
timeout 240 $M/test_cuda --gtest_filter='*InPlace*:*Staged*:*ReplayedGraph*:*Alternating*:*LongDecode*:*SameLogits*:*DeclinedOp*:*FusedKernelsNever*:Encodings/CudaOracle.*/q8_0:Encodings/CudaOracle.*/q4_0:Encodings/CudaOracle.*/f16:Encodings/CudaOracle.*/q4_k_m' > $OUT/test_cuda.txt 2>&1
grep -E "^\[ cuda|OK \]|FAILED|Failure|Expected|Which is|PASSED" $OUT/test_cuda.txt | head -50
echo "=== $(date -u +%T) test-ops CUDA0"
$M/ferry test-ops --backend CUDA0 > $OUT/ops.txt 2>&1; grep -E "FAIL" $OUT/ops.txt | head; tail -1 $OUT/ops.txt
echo "=== $(date -u +%T) tg128: compact key (default) vs FERRY_CUDA_COMPACT_KEY=0"
for r in 1 2 3; do
  echo "q4_0 default: $(tg $Q 128)"; echo "q4_0 COMPACT_KEY=0: $(tg $Q 128 FERRY_CUDA_COMPACT_KEY=0)"
done
for r in 1 2; do echo "tiny default: $(tg $T 128)"; echo "tiny COMPACT_KEY=0: $(tg $T 128 FERRY_CUDA_COMPACT_KEY=0)"; done
echo "f16 default: $(tg $H 128)"
echo "=== $(date -u +%T) graph stats and session profiles, local"
for v in FERRY_CUDA_COMPACT_KEY=1 FERRY_CUDA_COMPACT_KEY=0; do
  env $v FERRY_CUDA_GRAPH_STATS=1 FERRY_SESSION_PROFILE=1 $M/ferry bench -m $Q --device CUDA0 -p 0 -n 128 -r 3 > $OUT/prof-$v.txt 2>&1; echo "$v"; grep -E "profile|stats|tg128" $OUT/prof-$v.txt
done
echo "=== $(date -u +%T) served: session profiles of the clients, then the ratio rounds"
dir=$(mktemp -d); port=$((20000 + RANDOM % 20000))
FERRY_CUDA_GRAPH_STATS=1 $M/ferry serve --listen unix:$dir/s --device CUDA0 > $OUT/srv-unix.log 2>&1 &
FERRY_CUDA_GRAPH_STATS=1 $M/ferry serve --listen tcp:127.0.0.1:$port --device CUDA0 > $OUT/srv-tcp.log 2>&1 &
sleep 2
for a in unix:$dir/s tcp:127.0.0.1:$port; do
  FERRY_SESSION_PROFILE=1 $M/ferry bench -m $Q --remote $a -p 0 -n 128 -r 3 > $OUT/prof-remote.txt 2>&1; echo "$a"; grep -E "profile|tg128" $OUT/prof-remote.txt
done
kill %1 %2 2>/dev/null; sleep 1; grep -h "graph stats" $OUT/srv-*.log
DEVICE=CUDA0 OFF=0 bash bench/serve-step.sh $M/ferry $Q 3 128 > $OUT/serve.log 2>&1
grep -E "median|ratio" $OUT/serve.log | head -30
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 57, call A (any card), binaries of main at 36c26d8 (.dev57: ferry.xz, test_cuda.xz,
# fx.tar.xz; carry [".dev57"]). On an H200 first: the F16 target (1B F16 tg128 plan | default,
# three rounds; prediction ~1,335: stop 53's 1,314 x1.017 for the logits' store), the copies in
# flight swept (2,1 4,1 4,2 6,2 8,2: stop 53's step was 1.37x the H200's floor against 1.17x on
# an H100, so more in flight may pay there), `ferry bench -p 512 -n 128 -r 5` for F16, BF16,
# Q4_0 and tiny-llama Q8_0 (GPU memory lines), served 1B Q4_0 local | unix | tcp, three rounds.
# Then on any card: the whole of test_cuda and test-ops (e2d62ab's early_rows and f73f390's
# shared range check have not run on a GPU), and on an H100 served rounds as well.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
BIN=${BIN:-.dev57} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
T=../shared/fixtures/tiny-llama/tiny-llama-q8_0.gguf
date +%T
served() {
  servers_start
  served_rounds 3
}
if [[ $CARD == *H200* ]]; then
  gen_models
  plan_rounds 3
  row="F16 tg128 inflight"
  for k in 2,1 4,1 4,2 6,2 8,2; do
    left 20 "inflight $k" || break
    row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
  done
  echo "$row | default $(tg $H 128)"
  gen_types bf16
  bench_tables 5 $H /tmp/bf16.gguf $Q $T
  date +%T
  served
  date +%T
fi
(gen_models) > /dev/null 2>&1 &
GEN=$!
tests "*" $(cap 200)
left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 1; }
wait $GEN
date +%T
if [[ $CARD != *H200* ]]; then
  served
  bench_tables 3 $H $Q
fi
date +%T

#!/usr/bin/env bash
# Stop 55, call J: the table for 157a746 (the decode attentions stop at the last visible
# key; the graph's last product, as the persistent step, stores the logits into the session's
# read memory; reads kept by device address). On an H200 the F16 figures come first: the
# 1,330 t/s target (prediction ~1,340-1,360: stop 53's 1,314 with the copy, x1.017 for the
# store, the 144-key tg unchanged since). Then the whole of test_cuda and test-ops,
# `ferry bench -p 512 -n 128 -r 5` (the peer's command) for 1B F16, BF16, Q4_0 and tiny-llama
# Q8_0, and served 1B Q4_0: local with the copy (FERRY_CUDA_HOST_READ=0) | local | unix with
# the server's copy | unix | tcp.
# .dev55: ferry.xz, test_cuda.xz, fx.tar.xz (every tiny-llama fixture but the Q8_0 file, which
# is the repository's models/tiny-llama-q8_0.gguf). Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
T=../shared/fixtures/tiny-llama/tiny-llama-q8_0.gguf
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
f16_rows() {
  echo "--- 1B F16 tg128 (-p 0 -r 5): plan | default"
  for r in 1 2 3; do
    left 30 "F16 round $r" || break
    echo "$(R=5 tg $H 128 FERRY_CUDA_PERSIST=0) | $(R=5 tg $H 128)"
  done
}
tables() {
  for m in $H /tmp/bf16.gguf $Q $T; do
    left 40 "bench $(basename $m)" || break
    $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|peak"
  done
}
if [[ $CARD == *H200* ]]; then
  gen_models
  f16_rows
  gen_types bf16
  tables
  date +%T
fi
(gen_models; gen_types bf16) > /dev/null 2>&1 &
GEN=$!
tests "*" $(cap 200)
grep "logits stored into the read" $OUT/test_cuda.*.txt | head -4
left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 1; }
wait $GEN
date +%T
if [[ $CARD != *H200* ]]; then
  f16_rows
  tables
fi
left 100 "served" || exit 0
serve_unix
serve_tcp 0
FERRY_CUDA_HOST_READ=0 $F serve --listen unix:$SD/c --device CUDA0 > $SD/c.log 2>&1 &
SERVER_PIDS+=($!)
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served Q4_0: local copied | local | unix copied | unix | tcp"
for r in 1 2 3; do
  left 40 "served round $r" || break
  echo "$(FERRY_CUDA_HOST_READ=0 bt $Q --device CUDA0) | $(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/c) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
date +%T

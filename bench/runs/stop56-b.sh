#!/usr/bin/env bash
# Stop 56, call B (any card): the persistent step with BF16 weights (a1's commit), then the
# copies in flight swept for F16; on an H200 also stop56-a's measurements (the F16 target, bench's
# memory lines, served ratios).
# 1. test_cuda's persistent-decode tests (1B-shaped 2 layers F16 and BF16, h1024 F16; queued
#    ahead). Prediction: nmse <= 1e-9 for BF16 as for F16 (the same sums, the same orders).
# 2. 1B BF16 tg128 plan | step, three rounds. Prediction on an H100: ~995 -> ~1,085 (F16's).
# 3. 1B F16 tg128 with FERRY_CUDA_PERSIST_INFLIGHT default (3,1) | 2,1 | 4,1 | 4,2 | 6,1 | 3,2,
#    two rounds. Tuned at stop 50-51 on H100s (2-3 best there); the H200 streams 1.4x as fast, so
#    more in flight may pay there (stop 53: the step 1.37x the H200's floor, 1.17x on an H100).
# Binaries of this commit (.dev56b: ferry.xz, test_cuda.xz). Carry [".dev56b"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
BIN=${BIN:-.dev56b} source bench/runs/common.sh
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
g1=$!
gen_models &
g2=$!
tests "*PersistentDecode*" $(cap 150)
grep "persistent decode vs\|persistent decode queued" $OUT/test_cuda.*.txt | head
wait $g1 $g2
for r in 1 2 3; do
  left 30 "BF16 round $r" || break
  echo "BF16 tg128 plan | step: $(tg /tmp/bf16.gguf 128 FERRY_CUDA_PERSIST=0) | $(tg /tmp/bf16.gguf 128)"
done
for r in 1 2; do
  left 50 "sweep round $r" || break
  row="F16 tg128 inflight default $(tg $H 128)"
  for k in ${SWEEP:-2,1 4,1 4,2 6,1 3,2}; do
    row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"
  done
  echo "$row"
done
[[ $CARD == *H200* ]] || exit 0
for r in 1 2 3; do
  left 30 "F16 round $r" || break
  echo "F16 tg128 plan | default: $(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
done
for m in $H /tmp/bf16.gguf $Q; do
  left 40 "bench $(basename $m)" || break
  $F bench -m $m --device CUDA0 -p 512 -n 128 -r 5 2>&1 | grep -E "pp512|tg128|memory|MiB"
done
left 60 "served" || exit 0
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 3
date +%T

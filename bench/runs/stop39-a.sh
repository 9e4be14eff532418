#!/usr/bin/env bash
# Run A of stop 39: why no chain launched in stop 37-a's run (stop 39, H100: "0 chain
# launches" in every form, tg128 the same with FERRY_CUDA_CHAIN=1). FERRY_CUDA_CHAIN_TRACE=1
# prints each decision (the steps a chain may take, what was collected, the launch's shared
# memory, the kernel's attributes and its occupancy); their counts for the tiny f16 and q4_0
# models and the 1B F16 model, then, if a chain ran, 1B F16 tg128 with and without it.
# Carry [".devB"] (bench/build-for-device.sh, then xz; fx.tar.xz as stop36-a.sh says).
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models &
fx=../shared/fixtures/tiny-llama
for m in $fx/tiny-llama-f16.gguf $fx/tiny-llama-q4_0.gguf; do
  echo "=== $(date -u +%T) $(basename $m) chain trace"
  FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_TRACE=1 timeout 60 $F run -m $m --device CUDA0 \
    -p "The chain" -n 8 --temp 0 2>&1 >/dev/null | grep "chain" | sort | uniq -c | sort -rn | head -20
done
wait
echo "=== $(date -u +%T) 1B F16 chain trace"
FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_TRACE=1 timeout 60 $F run -m $H --device CUDA0 \
  -p "The chain" -n 8 --temp 0 2>&1 >/dev/null | grep "chain" | sort | uniq -c | sort -rn | head -20
echo "=== $(date -u +%T) 1B F16 tg128: default | CHAIN=1"
for r in 1 2 3; do
  left 30 "F16 round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_CHAIN=1 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

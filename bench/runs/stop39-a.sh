#!/usr/bin/env bash
# Run A of stop 39 (for the next session with a GPU): the chained products after the fix of
# 03ad090 (stop 39's H100 run found no chain launched in any form: each layer's run of
# chainable steps began at gate/up). First FERRY_CUDA_CHAIN_TRACE=1's decisions, counted, for
# the tiny f16 and q4_0 models and 1B F16 (the steps a chain may take, what was collected, the
# launch's shared memory, the kernel's attributes, its occupancy), then stop36-b.sh (the
# chain's tests, greedy text with it off and on, 1B F16 and Q4_0 tg128 side by side) in the
# time left. Prediction (stop 36's): F16 tg128 +8-12% with the chain, Q4_0 +5-12%.
# Carry [".devB"]: bench/build-for-device.sh .devB, xz ferry and test_cuda, fx.tar.xz as
# stop36-a.sh says and fx2.tar.xz with tiny-llama-f32.gguf (the F32 tests read it).
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models &
fx=../shared/fixtures/tiny-llama
trace() { # MODEL
  echo "=== $(date -u +%T) $(basename $1) chain trace"
  FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_TRACE=1 timeout 60 $F run -m $1 --device CUDA0 \
    -p "The chain" -n 8 --temp 0 2>&1 >/dev/null | grep "chain" | sort | uniq -c | sort -rn |
    head -20
}
trace $fx/tiny-llama-f16.gguf
trace $fx/tiny-llama-q4_0.gguf
wait
trace $H
LIMIT=$((LIMIT - SECONDS)) bash bench/runs/stop36-b.sh

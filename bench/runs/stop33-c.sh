#!/usr/bin/env bash
# Run C (stop 33, prepared; not yet run): run A's binaries, every test_cuda test with every
# tiny-llama fixture (main's CUDA changes since stop 32's run F have not run on a GPU: acb9c21's
# mirror launch, the shared cpu_pause of b0741ef in the progressive read's spin; the patches'
# tests with them), then `ferry test-ops --backend CUDA0` and the local tg128 figures.
BIN=${BIN:-.devA}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test"
tests "*" 420
wait
echo "=== $(date -u +%T) test-ops CUDA0: $($F test-ops --backend CUDA0 2>&1 | tail -1)"
echo "=== $(date -u +%T) tg128 1B Q4_0 $(bt $Q --device CUDA0), 1B F16 $(bt $H --device CUDA0)"
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 44, call I: k_mv_stream and k_mv_bulk fill b through one stream_put_b (the folded norm
# from weights the caller loaded, or b's floats, with the bulk form's hook that issues the
# rest of its slots' copies once b's loads are out), where k_mv_bulk had its own copy of the
# dispatch. Same operations in the same order, but the SASS of the 24 non-wide stream and bulk
# kernels differs in scheduling (the 4 wide ones are the same), so: their tests, and 1B
# tg128 side by side against main's binary (.dev16, ad5e6f9). Prediction: within the spread.
# Carry [".dev17"] (ferry.xz, test_cuda.xz, fx, old.xz: main's ferry).
BIN=.dev17 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
old_binary .dev17/old.xz
gen_models
gen_types bf16
B=/tmp/bf16.gguf
echo "=== $(date -u +%T) test_cuda"
tests "*Bulk*:*Stream*:*FoldedNorm*:*FusedKernels*:*ModelShaped*:*Progressive*:*Served*:*SameLogits*:*CudaOracle*/f16:*CudaOracle*/q4_0:*CudaOracle*/q8_0" $(cap 150)
b() { bt $1 --device CUDA0; }
o() { old $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128 new | main: F16, BF16, Q4_0"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  echo "round $r: F16 $(b $H) | $(o $H)  BF16 $(b $B) | $(o $B)  Q4_0 $(b $Q) | $(o $Q)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Runs E and F (stop 35): Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 products and row
# reads on CUDA, which the backend had declined (28 op cases on the CPU). Run E: read element
# by element (GET_ROWS, the generic product kernel for decode, dequantized to F16 for cuBLAS
# in prefill). Run F: decode through the float kernel's decoders (Dec<T>), MODELS below.
#  1. ferry test-ops --backend CUDA0: every op case against the float64 reference.
#  2. test_cuda: the op suite, SameLogits, fused decode, the declined-op fallback, the oracle
#     cases (every tiny-llama fixture).
#  3. 1B models of those types (gen-model; output and embeddings Q6_K), tg128 and pp512 on
#     CUDA0 (before: every product on the CPU).
# .devB holds ferry.xz, test_cuda.xz, fx.tar.xz and fx2.tar.xz; carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
MODELS=${MODELS:-q5_0 q3_K}
gen_types $MODELS &
echo "=== $(date -u +%T) ferry test-ops --backend CUDA0"
$F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "(rc $?)"
grep -iE "fail|declin|passed" $OUT/test-ops.txt | tail -12
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*EveryOp*:*SameLogits*:*FusedDecode*:*Declined*:*CudaOracle*:*F32With*}" 200
wait
for t in $MODELS; do
  m=/tmp/$t.gguf
  echo "=== $(date -u +%T) $(basename $m) ($(du -m $m | cut -f1) MB)"
  timeout 120 $F bench -m $m --device CUDA0 -p 512 -n 128 -r 3 2>&1 | tail -4
done
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Run A for the next session with a GPU (prepared in stop 35, not yet run): what stop 35 landed
# without a GPU check.
#  1. ferry test-ops --backend CUDA0: the new MUL_MAT_<type>_wide cases (72 columns: cuBLAS for
#     F16/Q4_0/Q6_K, the float kernel's column groups for Q5_0/Q3_K/IQ4_XS/MXFP4).
#  2. test_cuda: ModelShapedProductsMatchTheCpu (now with Q5_0, Q3_K, IQ4_XS and MXFP4, up to
#     100 columns), the op suite, SameLogits.
#  3. 1B Q5_0 / Q3_K / IQ4_XS / MXFP4 pp512 and tg128 in the landed path (prefill in column
#     groups; stop 35 measured 43.7-50.7k t/s pp512 with a dequantization to F16 for cuBLAS,
#     not landed), and 1B Q4_0 for scale.
# Build: bash bench/build-for-device.sh .devB (then xz ferry and test_cuda; fx.tar.xz with the
# f16, q4_0 and q8_0 tiny-llama fixtures); carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
MODELS=${MODELS:-q5_0 q3_K iq4_xs mxfp4}
gen_types $MODELS q4_0 &
echo "=== $(date -u +%T) ferry test-ops --backend CUDA0"
$F test-ops --backend CUDA0 > $OUT/test-ops.txt 2>&1
echo "(rc $?)"
grep -E "_wide|passed" $OUT/test-ops.txt | tail -12
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*ModelShaped*:*EveryOp*:*SameLogits*}" 300
wait
for t in $MODELS q4_0; do
  echo "=== $(date -u +%T) $t"
  timeout 120 $F bench -m /tmp/$t.gguf --device CUDA0 -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128"
done
echo "=== $(date -u +%T) done"

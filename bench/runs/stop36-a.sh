#!/usr/bin/env bash
# Run A for the next session with a GPU (prepared in stop 35, not yet run): what stop 35 landed
# without a GPU check.
#  1. ferry test-ops --backend CUDA0: the new MUL_MAT_<type>_wide cases (72 columns: cuBLAS for
#     F16/Q4_0/Q6_K, the float kernel's column groups for Q5_0/Q3_K/IQ4_XS/MXFP4), then again
#     with FERRY_CUDA_ELEM_GEMM=1 (those four dequantized to F16 for cuBLAS: stop 36, no GPU yet).
#  2. test_cuda: ModelShapedProductsMatchTheCpu (now with Q5_0, Q3_K, IQ4_XS and MXFP4, up to
#     100 columns), the op suite, SameLogits.
#  3. 1B Q5_0 / Q3_K / IQ4_XS / MXFP4 pp512 and tg128, prefill dequantized to F16 for cuBLAS
#     (FERRY_CUDA_ELEM_GEMM=1) against the float kernel's column groups (the default, =0),
#     and 1B Q4_0 for scale.
#  4. The q5_k_m pin (Q5KMBeatsThePeersKLButIsOneTop1PositionShort, stop 36) and its
#     exact-arithmetic test.
# One call of at most 600 s (run with timeout_s 600): the test caps (300 + 90 s, or half the
# time left before LIMIT) leave ~200 s for the benches, each step starting only while LIMIT
# allows; what finished is under $OUT either way.
# Build: bash bench/build-for-device.sh .devB (then xz ferry and test_cuda; fx.tar.xz with the
# f16, q4_0, q8_0 and q5_k_m tiny-llama fixtures); carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
MODELS=${MODELS:-q5_0 q3_K iq4_xs mxfp4}
gen_types $MODELS q4_0 &
echo "=== $(date -u +%T) ferry test-ops --backend CUDA0"
for g in 0 1; do
  left 60 "test-ops ELEM_GEMM=$g" || break
  FERRY_CUDA_ELEM_GEMM=$g timeout $(cap 240) $F test-ops --backend CUDA0 > $OUT/test-ops.$g.txt 2>&1
  echo "(FERRY_CUDA_ELEM_GEMM=$g: rc $?)"
  grep -E "_wide|passed" $OUT/test-ops.$g.txt | tail -12
done
echo "=== $(date -u +%T) test_cuda"
left 60 "test_cuda" && tests "${FILTER:-*ModelShaped*:*EveryOp*:*SameLogits*:*Q5KM*:*KQuant*}" $(cap 300)
left 40 "ModelShaped ELEM_GEMM=1" && FERRY_CUDA_ELEM_GEMM=1 tests "*ModelShaped*" $(cap 90)
wait
for t in $MODELS q4_0; do
  for g in 1 0; do
    left 25 "$t ELEM_GEMM=$g" || continue
    echo "=== $(date -u +%T) $t FERRY_CUDA_ELEM_GEMM=$g"
    FERRY_CUDA_ELEM_GEMM=$g timeout 120 $F bench -m /tmp/$t.gguf --device CUDA0 -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128"
  done
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

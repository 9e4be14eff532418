#!/usr/bin/env bash
# Run A of stop 37: stop36-b (the chained products) and then stop36-a's checks in one call, since
# machines came rarely this session: what matters most runs first, and each later step starts
# only while the call has time for it (SECONDS against the 600 s limit).
#  1. test_cuda: ChainedProductsEqualSeparateLaunches, BulkStreamEqualsTheRegisterForm,
#     SameLogitsEveryRun.
#  2. 1B F16 and Q4_0 greedy text, chain off and on: the same tokens.
#  3. 1B F16 tg128, four rounds: default | CHAIN=1 | CHAIN=1 COOP=0 | BULK_FN=1 | CHAIN=1 MV_BULK=0;
#     1B Q4_0, three rounds: default | CHAIN=1.
#  4. ferry test-ops --backend CUDA0 with FERRY_CUDA_ELEM_GEMM 0 and 1 (the _wide cases).
#  5. test_cuda: ModelShaped (and with ELEM_GEMM=1), EveryOp, Q5KM, KQuant.
#  6. 1B Q5_0 / Q3_K / IQ4_XS / MXFP4 / Q4_0 pp512 and tg128 with ELEM_GEMM 1 and 0.
# (The predictions are in stop36-a.sh and stop36-b.sh.) Carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
LIMIT=${LIMIT:-585}
left() { [ $((SECONDS + $1)) -lt ${LIMIT:-585} ] || { echo "(skipped at ${SECONDS}s: $2)"; return 1; }; }
MODELS=${MODELS:-q5_0 q3_K iq4_xs mxfp4}
(gen_models; gen_types $MODELS q4_0) &
echo "=== $(date -u +%T) test_cuda: chain"
tests "*ChainedProducts*:*BulkStream*:*SameLogits*" $((LIMIT / 3 < 150 ? LIMIT / 3 : 150))
wait
echo "=== $(date -u +%T) greedy text, chain off and on"
for m in $H $Q; do
  for c in 0 1; do
    FERRY_CUDA_CHAIN=$c timeout 60 $F run -m $m --device CUDA0 -p "The chain" -n 64 --temp 0 \
      > $OUT/text.$c.txt 2> $OUT/text.$c.err
    echo "$(basename $m) chain=$c rc $? $(tail -1 $OUT/text.$c.err)"
  done
  cmp $OUT/text.0.txt $OUT/text.1.txt && echo "same text"
done
echo "=== $(date -u +%T) 1B F16 tg128: default | CHAIN=1 | CHAIN=1 COOP=0 | BULK_FN=1 | CHAIN=1 MV_BULK=0"
for r in 1 2 3 4; do
  left 60 "F16 round $r" || break
  a=$(bt $H --device CUDA0)
  b=$(FERRY_CUDA_CHAIN=1 bt $H --device CUDA0)
  c=$(FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_COOP=0 bt $H --device CUDA0)
  d=$(FERRY_CUDA_MV_BULK_FN=1 bt $H --device CUDA0)
  e=$(FERRY_CUDA_CHAIN=1 FERRY_CUDA_MV_BULK=0 bt $H --device CUDA0)
  echo "round $r: $a | $b | $c | $d | $e"
done
echo "=== $(date -u +%T) 1B Q4_0 tg128: default | CHAIN=1"
for r in 1 2 3; do
  left 30 "Q4_0 round $r" || break
  echo "round $r: $(bt $Q --device CUDA0) | $(FERRY_CUDA_CHAIN=1 bt $Q --device CUDA0)"
done
echo "=== $(date -u +%T) ferry test-ops --backend CUDA0"
for g in 0 1; do
  left 60 "test-ops ELEM_GEMM=$g" || break
  FERRY_CUDA_ELEM_GEMM=$g timeout 90 $F test-ops --backend CUDA0 > $OUT/test-ops.$g.txt 2>&1
  echo "(FERRY_CUDA_ELEM_GEMM=$g: rc $?)"
  grep -E "_wide|passed" $OUT/test-ops.$g.txt | tail -12
done
echo "=== $(date -u +%T) test_cuda: products, ops, q5_k_m"
left 60 "test_cuda products" &&
  tests "*ModelShaped*:*EveryOp*:*Q5KM*:*KQuant*" $((LIMIT - 30 - SECONDS < 200 ? LIMIT - 30 - SECONDS : 200))
left 40 "ModelShaped ELEM_GEMM=1" && FERRY_CUDA_ELEM_GEMM=1 tests "*ModelShaped*" 60
for t in $MODELS q4_0; do
  for g in 1 0; do
    left 25 "$t ELEM_GEMM=$g" || continue
    echo "=== $(date -u +%T) $t FERRY_CUDA_ELEM_GEMM=$g"
    FERRY_CUDA_ELEM_GEMM=$g timeout 60 $F bench -m /tmp/$t.gguf --device CUDA0 -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128"
  done
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

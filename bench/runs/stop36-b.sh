#!/usr/bin/env bash
# Run B for the next session with a GPU (prepared in stop 36, not yet run): the chained
# products (k_mv_chain, FERRY_CUDA_CHAIN=1, off by default) and k_mv_bulk on the functions the
# chain shares with it (FERRY_CUDA_MV_BULK_FN=1).
#  1. test_cuda: ChainedProductsEqualSeparateLaunches (f16 bulk chain cooperative or not, f16
#     register chain, q4_0 register chain, and BULK_FN, each against its unchained launches:
#     memcmp of token-by-token logits; the chains must have run), BulkStreamEqualsTheRegister
#     Form, SameLogitsEveryRun.
#  2. 1B F16 and Q4_0 greedy text (64 tokens) with the chain off and on: the same tokens.
#  3. 1B F16 tg128 side by side, four rounds: default, CHAIN=1, CHAIN=1 COOP=0, BULK_FN=1,
#     CHAIN=1 with the register form (MV_BULK=0); 1B Q4_0: default, CHAIN=1.
# Prediction (written in stop 36, before any run): stop 27's timeline puts 4-5 us of each
# product outside its bytes (a kernel's tail, the next one's start and prologue); a chain
# keeps three of a layer's five boundaries (wo -> gate/up -> down -> next q/k/v) inside one
# launch, each for a grid barrier (~1-1.5 us) while the next product's first pieces stream.
# So ~5-6 us a layer: 1B F16 tg128 +8-12% (1,164 -> 1,260-1,300 t/s); 1B Q4_0 (28.7 us a
# layer, 7 of them bytes) +10-20% less what wo and down lose from two 8-warp blocks an SM
# against their one 16-warp block (stop 27 run G: 7%), so +5-12% (1,750 -> 1,850-1,950). It
# loses if the barrier or the cooperative launch costs more than the tails it saves. BULK_FN
# within +-1%.
# Build: bash bench/build-for-device.sh .devB (then xz ferry and test_cuda; fx.tar.xz with the
# f16, q4_0, q8_0 and q5_k_m tiny-llama fixtures); carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*ChainedProducts*:*BulkStream*:*SameLogits*}" $(cap 300)
wait
# A chain that never passes its grid barrier hangs its launch: when the tests timed out, the
# steps that would launch it again (each until its own timeout) are left out.
CHAIN=1
[ $TESTS_RC = 124 ] && CHAIN=0 && echo "(tests timed out: the steps with the chain on are skipped)"
echo "=== $(date -u +%T) greedy text, chain off and on"
for m in $H $Q; do
  left 40 "greedy text $(basename $m)" || break
  for c in $(seq 0 $CHAIN); do
    FERRY_CUDA_CHAIN=$c timeout 120 $F run -m $m --device CUDA0 -p "The chain" -n 64 --temp 0 \
      > $OUT/text.$c.txt 2> /tmp/text.$c.err
    echo "$(basename $m) chain=$c rc $? $(tail -1 /tmp/text.$c.err)"
  done
  [ $CHAIN = 1 ] && cmp $OUT/text.0.txt $OUT/text.1.txt && echo "same text"
done
echo "=== $(date -u +%T) 1B F16 tg128: default | CHAIN=1 | CHAIN=1 COOP=0 | BULK_FN=1 | CHAIN=1 MV_BULK=0"
for r in 1 2 3 4; do
  left 60 "F16 round $r" || break
  a=$(bt $H --device CUDA0) b=- c=- e=-
  if [ $CHAIN = 1 ]; then
    b=$(FERRY_CUDA_CHAIN=1 bt $H --device CUDA0)
    c=$(FERRY_CUDA_CHAIN=1 FERRY_CUDA_CHAIN_COOP=0 bt $H --device CUDA0)
  fi
  d=$(FERRY_CUDA_MV_BULK_FN=1 bt $H --device CUDA0)
  [ $CHAIN = 1 ] && e=$(FERRY_CUDA_CHAIN=1 FERRY_CUDA_MV_BULK=0 bt $H --device CUDA0)
  echo "round $r: $a | $b | $c | $d | $e"
done
echo "=== $(date -u +%T) 1B Q4_0 tg128: default | CHAIN=1"
for r in 1 2 3; do
  left 30 "Q4_0 round $r" || break
  b=-
  [ $CHAIN = 1 ] && b=$(FERRY_CUDA_CHAIN=1 bt $Q --device CUDA0)
  echo "round $r: $(bt $Q --device CUDA0) | $b"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

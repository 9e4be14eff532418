#!/usr/bin/env bash
# Run B (stop 35), after run A: every product asking for the next product's first 8-32 MiB at
# its tail (run A's form) lost 5-11%, more with more bytes. Run A's "off" column (F16
# 1,007-1,035, Q4_0 1,631-1,637) was also ~8% under stop 34's figures, so HEAD (6364a92) runs
# beside it here (.devB/ferry0.xz). The new form asks only where DRAM would idle: a product
# whose loads all go out before its wait asks first (q/k/v for wo, wo for gate/up:
# FERRY_CUDA_L2_NEXT_AT=1), and the decode attention asks for the product after wo (gate/up,
# AT=2), 3 both.
#  1. test_cuda: the L2Next, streaming and SameLogits tests.
#  2. F16 and Q4_0 tg128, three rounds: HEAD | off | AT=1 16 | AT=2 16 | AT=2 32 | AT=2 16 bulk |
#     AT=3 16.
# Prediction: off = HEAD within noise; AT=2 16 MiB +3-6% on F16 (gate/up's first 16 MB from L2:
# ~4 us a layer of 60 us), less on Q4_0 (gate/up is 19 MB, ~4 us of its 9); AT=1 less.
# (.devB/ferry0.xz: HEAD 6364a92 built the same way.)
BIN=${BIN:-.devB}
source bench/runs/common.sh
unpack ferry0
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*L2Next*:*Stream*:*SameLogits*}" 300
wait
cols() { # MODEL
  echo "$(F=/tmp/ferry0 bt $1 --device CUDA0)" "$(bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_AT=1 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_AT=2 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=32 FERRY_CUDA_L2_NEXT_AT=2 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_AT=2 FERRY_CUDA_L2_NEXT_MODE=2 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_AT=3 bt $1 --device CUDA0)"
}
for m in $H $Q; do
  echo "=== $(date -u +%T) $(basename $m) tg128: HEAD | off | AT=1 16 | AT=2 16 | AT=2 32 | AT=2 16 bulk | AT=3 16"
  bt $m --device CUDA0 > /dev/null
  for r in 1 2 3; do cols $m; done
done
echo "=== $(date -u +%T) done"

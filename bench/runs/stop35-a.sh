#!/usr/bin/env bash
# Run A (stop 35): the next product's weights asked for in L2 (FERRY_CUDA_L2_NEXT=MiB,
# FERRY_CUDA_L2_NEXT_MODE=0 lines / 1 lines evict_last / 2 one bulk prefetch a warp).
#  1. test_cuda: the prefetch changes no bit (every mode, partial and whole budgets), the
#     streaming-form tests, SameLogitsEveryRun.
#  2. 1B F16 tg128 side by side, three rounds: off | 8 | 16 | 32 MiB (mode 0) | 16 mode 1 |
#     16 mode 2.
#  3. 1B Q4_0 tg128, the same columns, three rounds.
# Prediction (written before the run): the attention (~5.5 us a layer with DRAM nearly idle),
# the kernel boundaries (~1 us each) and the step's gap are filled with the next product's
# bytes: F16 +5-10% at 16 MiB (1,110 -> 1,170-1,220 t/s), Q4_0 +3-6% (1,775 -> 1,830-1,880);
# 32 MiB no better than 16 (the attention window holds ~20 MB at 4 TB/s); evict_last no
# better than normal; the bulk form about the same as lines.
# .devB held ferry and test_cuda built with bench/runs/stop35-l2next.patch applied, and
# fx.tar.xz; carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*L2Next*:*Stream*:*SameLogits*}" 300
wait
cols() { # MODEL
  echo "$(bt $1 --device CUDA0)" "$(FERRY_CUDA_L2_NEXT=8 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 bt $1 --device CUDA0)" "$(FERRY_CUDA_L2_NEXT=32 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_MODE=1 bt $1 --device CUDA0)" \
    "$(FERRY_CUDA_L2_NEXT=16 FERRY_CUDA_L2_NEXT_MODE=2 bt $1 --device CUDA0)"
}
for m in $H $Q; do
  echo "=== $(date -u +%T) $(basename $m) tg128: off | 8 | 16 | 32 MiB | 16 evict_last | 16 bulk"
  bt $m --device CUDA0 > /dev/null
  for r in 1 2 3; do cols $m; done
done
echo "=== $(date -u +%T) done"

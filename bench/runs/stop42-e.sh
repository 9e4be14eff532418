#!/usr/bin/env bash
# Stop 42, call E: the evict-first weights, fixed (call D: the Q4_0/Q6_K block-lane decoders'
# dot read the int8 kernel's ring copies in shared memory through the new global-only loads,
# "operation not supported on global/shared address space"; dot now reads through a generic
# pointer), .dev3: test_cuda's product tests and oracle cases, then the bulk form's slots
# issued before the wait again (PRE), as L2 now keeps what the prologues read.
# Carry [".dev3"].
BIN=.dev3 source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
echo "=== $(date -u +%T) test_cuda"
tests "*ModelShaped*:*BlockLane*:*RawFloat*:*StreamProducts*:*WideStream*:*BulkStream*:*RingDecode*:*RingProducts*:*CudaOracle*:*Events*:*TooLarge*" $(cap 200)
grep -hE "KL|nmse" $OUT/test_cuda.*.txt | grep -v "prompt" | head -20
wait
echo "=== $(date -u +%T) F16 tg128, new: PRE=2 (default) | PRE=3 | PRE=1 | S=2"
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK_PRE=3 bt $H --device CUDA0)" \
    "| $(FERRY_CUDA_MV_BULK_PRE=1 bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK=2 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

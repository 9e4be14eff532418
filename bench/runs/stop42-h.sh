#!/usr/bin/env bash
# Stop 42, call H: the bulk form's first pieces asked for in L2 before griddepcontrol.wait
# instead of copied (FERRY_CUDA_MV_BULK_L2PRE=N: N pieces a warp prefetched by
# cp.async.bulk.prefetch.L2 after the PRE copies; with it, PRE=0 means no copies before the
# wait). Call F's timeline (H100): gate/up's prologue 6.4 us, about the time the PRE copies
# already issued (2 of 3 slots, ~128 KiB an SM) take to reach the SM at its share of DRAM
# bandwidth: b's loads come back behind them. From L2 the copies after the wait come at
# L2 speed, and nothing queues ahead of b. Prediction (written before the run): gate/up's
# and q/k/v's prologues -2 to -4 us, 1B F16 tg128 +2-5% with PRE=0 L2PRE=3 or 6.
# Carry [".dev5", ".devT5"].
BIN=.dev5 source bench/runs/common.sh
TRACE_BIN=.devT5
gen_models
echo "=== $(date -u +%T) test_cuda, PRE=0 L2PRE=6"
FERRY_CUDA_MV_BULK_PRE=0 FERRY_CUDA_MV_BULK_L2PRE=6 tests "*BulkStream*:*FoldedNorm*:*FusedKernelsNever*" $(cap 150)
v() { bt $H --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: default | PRE=0 L2PRE=3 | PRE=0 L2PRE=6 | PRE=1 L2PRE=2 | PRE=2 L2PRE=4"
for r in 1 2 3; do
  left 60 "round $r" || break
  echo "round $r: $(v) | $(FERRY_CUDA_MV_BULK_PRE=0 FERRY_CUDA_MV_BULK_L2PRE=3 v)" \
    "| $(FERRY_CUDA_MV_BULK_PRE=0 FERRY_CUDA_MV_BULK_L2PRE=6 v) | $(FERRY_CUDA_MV_BULK_PRE=1 FERRY_CUDA_MV_BULK_L2PRE=2 v)" \
    "| $(FERRY_CUDA_MV_BULK_PRE=2 FERRY_CUDA_MV_BULK_L2PRE=4 v)"
done
timeline l2pre6 FERRY_CUDA_MV_BULK_PRE=0 FERRY_CUDA_MV_BULK_L2PRE=6
echo "=== $(date -u +%T) done at ${SECONDS}s"

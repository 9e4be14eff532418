#!/usr/bin/env bash
# Stop 43, call A: gate/up's first weights asked for in L2 by the decode attention
# (FERRY_CUDA_L2_NEXT=KiB, off by default; FERRY_CUDA_L2_NEXT_AT=1: at the attention's start
# instead of after its wait). Stop 35 measured this slower on the H200 (its AT=2 bulk form,
# 16 MiB: 1,059-1,060 t/s against 1,072-1,073), when the latency-bound loads beside it missed
# L2 and queued at DRAM behind it; with the weights evict-first (stop 42) they hit L2. Stop 42's
# H100 trace: wo's 8.4 MB are all in flight before its wait, ~2.8 us of DRAM time in a ~4.9 us
# attention, then gate/up's prologue (~6.4 us) waits for its first copies from DRAM.
# Prediction (written before the run): 4-8 MiB gains, gate/up's prologue -1 to -3 us, 1B F16
# tg128 +1-3% on an H100 (more on an H200, whose DRAM idles longer in the same latency);
# 16 MiB delays wo and gains less; Q4_0 +0.5-1.5%. (.dev1: this build, its tests and
# fixtures; .devT1: its trace build.) Carry [".dev1", ".devT1"].
BIN=.dev1 source bench/runs/common.sh
TRACE_BIN=.devT1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
gen_models
echo "=== $(date -u +%T) test_cuda"
tests "*EarlyAttention*:*Replayed*:*FusedKernelsNever*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 120)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: off | 4 MiB | 8 MiB | 16 MiB | 8 MiB before the wait"
for r in 1 2 3; do
  left 60 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_L2_NEXT=4096 b $H) | $(FERRY_CUDA_L2_NEXT=8192 b $H) | $(FERRY_CUDA_L2_NEXT=16384 b $H) | $(FERRY_CUDA_L2_NEXT=8192 FERRY_CUDA_L2_NEXT_AT=1 b $H)"
  echo "round $r: Q4_0 $(b $Q) | $(FERRY_CUDA_L2_NEXT=4096 b $Q) | $(FERRY_CUDA_L2_NEXT=8192 b $Q) | $(FERRY_CUDA_L2_NEXT=16384 b $Q) | $(FERRY_CUDA_L2_NEXT=8192 FERRY_CUDA_L2_NEXT_AT=1 b $Q)"
done
left 30 "timeline" && timeline off
left 30 "timeline" && timeline l2next8 FERRY_CUDA_L2_NEXT=8192
echo "=== $(date -u +%T) done at ${SECONDS}s"

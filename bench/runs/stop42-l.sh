#!/usr/bin/env bash
# Stop 42, call L: the early attention's indices read before griddepcontrol.wait where they
# are the graph's inputs (default now; FERRY_CUDA_ATTN_EARLY_IDX=0: after it, as before), and
# its dependents' launch allowed only once its loads after the wait are issued
# (FERRY_CUDA_ATTN_LATE_TRIGGER=1). Call F's timeline (H100): the attention's prologue 3.9 us
# after its wait for two dependent round trips (the indices, then the rows and q), while wo's
# blocks, launched at the attention's wait, issue their 8.4 MB of copies on the same SMs, so
# the second round trip comes back behind them. Prediction (written before the run): the
# attention -1 to -2 us a layer, 1B F16 and Q4_0 tg128 +1.5-3%; the late trigger another
# -0.5 us. (.dev7: this build, its tests and fixtures; .devT7: its trace build.)
# Carry [".dev7", ".devT7"].
BIN=.dev7 source bench/runs/common.sh
TRACE_BIN=.devT7
gen_models
echo "=== $(date -u +%T) test_cuda"
tests "*EarlyAttention*:*LongDecode*:*Chunked*:*SameLogits*:*Replayed*:*FusedKernelsNever*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 120)
FERRY_CUDA_ATTN_LATE_TRIGGER=1 tests "*EarlyAttention*:*LongDecode*:*CudaOracle*/f16:*CudaOracle*/q4_0" $(cap 120)
b() { bt $1 --device CUDA0; }
echo "=== $(date -u +%T) tg128: indices early (default) | EARLY_IDX=0 (before) | + LATE_TRIGGER=1"
for r in 1 2 3 4; do
  left 45 "round $r" || break
  echo "round $r: F16 $(b $H) | $(FERRY_CUDA_ATTN_EARLY_IDX=0 b $H) | $(FERRY_CUDA_ATTN_LATE_TRIGGER=1 b $H)" \
    "  Q4_0 $(b $Q) | $(FERRY_CUDA_ATTN_EARLY_IDX=0 b $Q) | $(FERRY_CUDA_ATTN_LATE_TRIGGER=1 b $Q)"
done
left 30 "timeline" && timeline idx
left 30 "timeline" && timeline late FERRY_CUDA_ATTN_LATE_TRIGGER=1
echo "=== $(date -u +%T) done at ${SECONDS}s"

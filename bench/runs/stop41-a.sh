#!/usr/bin/env bash
# Run A of stop 41: wo in one bulk block per SM (FERRY_CUDA_MV_BULK_SOLO, bulk_solo in
# mv-stream.cu). Stop 27's timeline: gate/up starts its weights from DRAM only when wo's
# blocks leave the SMs; two F16 bulk blocks of ~90 registers a thread leave 16K of the SM's 64K
# registers, less than a gate/up block needs. wo's 8.4 MB are all in flight with one block per
# SM (two rows a warp, S = 2), so one block leaves room for a gate/up block beside it, which
# issues its first 64 KiB a SM while the attention runs.
# Prediction (written before the run): gate/up's first blocks start before wo's end (the
# timeline's "start" column negative), its prologue shorter by ~2-3 us a layer (8.4 MB at
# ~3 TB/s), 1B F16 tg128 +3-4% on an H100 (1,051 -> ~1,010 us a step); Q4_0 unchanged (its wo
# is the register form's).
#  1. test_cuda: the solo launch's test and the bulk/stream tests (f16, q4_0 fixtures in fx/);
#  2. the trace build's timeline (.devT), F16, solo on and off;
#  3. 1B F16 tg128 side by side, solo on / off alternating; BF16 and Q4_0 fewer rounds.
# Carry [".devF", ".devT"] (bash bench/build-for-device.sh .devF; the trace build into .devT;
# ferry and test_cuda xz-compressed).
BIN=${BIN:-.devF}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*SoloBulk*:*BulkStream*:*WideStream*:*StreamProducts*}" $(cap 200)
TRACE_BIN=.devT  # (timeline: common.sh)
timeline f16-solo
timeline f16-two FERRY_CUDA_MV_BULK_SOLO=0
wait
echo "=== $(date -u +%T) tg128 1B F16: solo | two blocks"
for r in 1 2 3 4 5; do
  left 40 "F16 round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK_SOLO=0 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) tg128 1B BF16, Q4_0: solo | two blocks"
for r in 1 2; do
  left 60 "BF16/Q4_0 round $r" || break
  echo "round $r: BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(FERRY_CUDA_MV_BULK_SOLO=0 bt /tmp/bf16.gguf --device CUDA0)" \
    " Q4_0 $(bt $Q --device CUDA0) | $(FERRY_CUDA_MV_BULK_SOLO=0 bt $Q --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

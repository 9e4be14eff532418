#!/usr/bin/env bash
# Run C of stop 41: the bulk form's slots issued in two parts. Runs A and B (H100): gate/up's
# prologue (its folded RMS norm of b, after griddepcontrol.wait) takes 5.0 us with 2 slots a
# warp and 7.2 us with 3: b's loads queue behind the copies the blocks issued before the wait
# (16.9 / 25.3 MB, ~5.2 / 7.7 us at the 3.27 TB/s the output product reaches); only then do
# the rows start to drain the slots and refill them, so the pipe runs dry at the prologue's end.
# k_mv_bulk now issues PRE slots a warp before the wait and the rest once the block's loads of
# b are issued (FERRY_CUDA_MV_BULK_PRE; 0: all before, as until now), and loads the folded
# norm's weights before the wait.
# Prediction (written before the run): with S = 3, PRE = 1 (8.4 MB before the wait, ~2.6 us)
# gate/up's prologue falls to ~2-3 us and its total by ~1.5 us, q/k/v's by ~0.5: 1B F16 tg128
# +2-3% over S = 3 alone (run B: S = 3 +0.9% over S = 2).
#  1. test_cuda: the bulk-form tests with PRE (tiny-llama f16, q4_0 and reference in fx/);
#  2. the trace build's timeline (.devT3), F16, S = 3 with PRE = 0 / 1 and S = 2 with PRE = 1;
#  3. 1B F16 tg128 side by side; BF16 and Q4_0 fewer rounds.
# Carry [".devH", ".devT3"].
BIN=${BIN:-.devH}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1 &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*BulkStream*:*StreamProducts*:*SameLogitsEveryRun*}" $(cap 200)
TRACE_BIN=.devT3  # (timeline: common.sh)
timeline f16-s3 FERRY_CUDA_MV_BULK=3
timeline f16-s3p1 FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_PRE=1
timeline f16-s2p1 FERRY_CUDA_MV_BULK_PRE=1
wait
echo "=== $(date -u +%T) tg128 1B F16: S=2 | S=3 | S=3 PRE=1 | S=3 PRE=2 | S=2 PRE=1"
for r in 1 2 3 4 5; do
  left 50 "F16 round $r" || break
  echo "round $r: $(bt $H --device CUDA0) | $(FERRY_CUDA_MV_BULK=3 bt $H --device CUDA0)" \
    "| $(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_PRE=1 bt $H --device CUDA0)" \
    "| $(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_PRE=2 bt $H --device CUDA0)" \
    "| $(FERRY_CUDA_MV_BULK_PRE=1 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) tg128 1B BF16: S=2 | S=3 PRE=1; Q4_0"
for r in 1 2 3; do
  left 40 "BF16 round $r" || break
  echo "round $r: $(bt /tmp/bf16.gguf --device CUDA0) | $(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_PRE=1 bt /tmp/bf16.gguf --device CUDA0)  Q4_0 $(bt $Q --device CUDA0)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

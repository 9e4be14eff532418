#!/usr/bin/env bash
# Run G of stop 41 (an H200 at last): main's new defaults (b2303d4: S = 3, PRE = 2) against the
# old ones side by side, 1B F16 / BF16 / Q4_0 tg128, then served side by side (local | unix |
# tcp). Carry [".devI"] (the binaries of b2303d4).
BIN=${BIN:-.devI}
source bench/runs/common.sh
gen_models
$F gen-model --preset llama-3.2-1b --type bf16 -o /tmp/bf16.gguf > /dev/null 2>&1
old() { FERRY_CUDA_MV_BULK=2 FERRY_CUDA_MV_BULK_PRE=0 bt "$@"; }
echo "=== $(date -u +%T) tg128 1B F16 new | old, BF16 new | old, Q4_0"
for r in 1 2 3; do
  echo "round $r: F16 $(bt $H --device CUDA0) | $(old $H --device CUDA0)" \
    " BF16 $(bt /tmp/bf16.gguf --device CUDA0) | $(old /tmp/bf16.gguf --device CUDA0)  Q4_0 $(bt $Q --device CUDA0)"
done
left 150 "served" || exit 0
echo "=== $(date -u +%T) served"
served_side_by_side
echo "=== $(date -u +%T) done at ${SECONDS}s"

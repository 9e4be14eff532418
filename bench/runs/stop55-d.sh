#!/usr/bin/env bash
# Stop 55, call D: after calls B-C (H100: a 256-key attended length cost tg128 2.4-2.8% against
# 144 keys; the step's k_persist 907 -> 927 us, Q4_0's FLASH_ATTN_EXT 7.68 -> 8.63 us a call),
# the persistent step's attention and the plan's k_attn_row (early form) stop at the last key
# the mask lets through, and bench gives each test its own context (as llama-bench).
# The tests that run the changed kernels, then tg128 rows: new -c 144 | new -c 528 | new -c 528
# FERRY_CUDA_ATTN_EARLY_MASK=0 | new -p 512 -n 128's tg | old (.dev54) -p 0 | old -p 512's tg.
# Prediction: new -c 528 within 0.5% of new -c 144 (F16 and Q4_0); EARLY_MASK=0 gives Q4_0's
# old -c 528 figure back; new -c 144 itself 0-1% above old -p 0 (the masked keys 129-143 too).
# .dev55: ferry.xz, ferry-old.xz, test_cuda.xz, fx.tar.xz (tiny-llama f16, q8_0, the oracle's
# logits). Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
persist_tests 'Cuda.ChunkedDecode*:Cuda.LongDecode*:Cuda.StepsQueuedAhead*:Cuda.ServedStepsQueuedAhead*:Cuda.EarlyAttention*:Cuda.Persistent*:Cuda.FusedDecode*:Cuda.F32With*' 240
grep "reading the mask first" $OUT/test_cuda.*.txt | head -4
unpack ferry-old
gen_models
t128() { # BINARY MODEL ARGS...: tg128 t/s
  local f=$1 m=$2; shift 2
  local envs=() args=()
  for a in "$@"; do if [[ $a == FERRY_* ]]; then envs+=("$a"); else args+=("$a"); fi; done
  env "${envs[@]}" $f bench -m $m --device CUDA0 -n 128 -r 5 "${args[@]}" 2>&1 | awk -F'|' '$7 ~ /tg128/ {print $8}'
}
for r in 1 2; do
  for m in $H $Q; do
    left 60 "$(basename $m) round $r" || break
    echo "$(basename $m): $(t128 $F $m -p 0 -c 144) | $(t128 $F $m -p 0 -c 528) | $(t128 $F $m -p 0 -c 528 FERRY_CUDA_ATTN_EARLY_MASK=0) | $(t128 $F $m -p 512) | $(t128 /tmp/ferry-old $m -p 0) | $(t128 /tmp/ferry-old $m -p 512)"
  done
done
date +%T

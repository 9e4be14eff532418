#!/usr/bin/env bash
# Stop 44, call L: the fold's one-fence form (call J: 943-951 against 951-973 separate, the
# closest form) with the other knobs: one block an SM (116 KiB), gate/up launched once wo's
# copies are out (T1, here at the block's start) or once the partials are written (T2), and
# BF16. Prediction (before the run): within the spread of L0F1; none above separate.
# Carry [".dev18"] (the fold's build with every knob, bench/runs/stop44-wo-fold.patch).
BIN=.dev18 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
gen_types bf16
B=/tmp/bf16.gguf
b() { bt $1 --device CUDA0; }
f1() { FERRY_CUDA_ATTN_WO_LOAD=0 FERRY_CUDA_ATTN_WO_FENCE_ONE=1 bt "$@" --device CUDA0; }
echo "=== $(date -u +%T) F16 tg128: separate | L0F1 | L0F1 S116 | L0F1 T1 | L0F1 T2; BF16 separate | L0F1"
for r in 1 2 3 4; do
  left 40 "round $r" || break
  echo "round $r: $(FERRY_CUDA_ATTN_WO=0 b $H) | $(f1 $H) | $(FERRY_CUDA_ATTN_WO_SMEM=116 f1 $H) | $(FERRY_CUDA_ATTN_WO_TRIGGER=1 f1 $H) | $(FERRY_CUDA_ATTN_WO_TRIGGER=2 f1 $H)  BF16 $(FERRY_CUDA_ATTN_WO=0 b $B) | $(f1 $B)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

#!/usr/bin/env bash
# Stop 58, call C (any card): why the quantized persistent step (call B: 1B Q4_0 tg128 1,128
# t/s against the plan's 1,848 on an H100, the same with 6 to 28 copies in flight) is slow and
# differs from the plan (logits nmse 3.9e-4). (1) The diagnostic test's logits, plan | plan
# without the streaming form | step | plan unfused, for F16 and Q4_0, with the int8 products
# (q8) and, in a second process, without (FERRY_CUDA_MV_Q8=0: the plan's float kernel on the
# block formats), compared pairwise: is the step's difference the activations' int8 rounding
# (then the q8 plan sits as far from the float plan) or its own? (2) Per-phase stamps of the
# last step (FERRY_CUDA_PERSIST_STAMPS=1), Q4_0 and F16. Binaries: .dev58b (carry [".dev58b"]),
# built from branch persist-quant (1a75a4d), whose test_cuda has Cuda.DiagPersistQ4 (.dev58b/cmp.py:
# /tmp/cmp.py of that stop, pairwise nmse of the saved logits).
BIN=${BIN:-.dev58b} source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(gen_models) > /dev/null 2>&1 &
GEN=$!
mkdir -p $OUT/diag
FERRY_DIAG_DIR=$OUT/diag FERRY_DIAG_TAG=q8 tests "Cuda.DiagPersistQ4" 120
grep "diag" $OUT/test_cuda.*.1.txt
FERRY_CUDA_MV_Q8=0 FERRY_DIAG_DIR=$OUT/diag FERRY_DIAG_TAG=float tests "Cuda.DiagPersistQ4" 120
grep "diag" $OUT/test_cuda.*.2.txt
python3 $BIN/cmp.py $OUT/diag
rm -f $OUT/diag/*.bin
wait $GEN
for m in $Q $H; do
  FERRY_CUDA_PERSIST_STAMPS=1 $F bench -m $m --device CUDA0 -p 0 -n 32 -r 1 > $OUT/stamps-$(basename $m .gguf).txt 2>&1
  echo "== $(basename $m) $(grep tg32 $OUT/stamps-$(basename $m .gguf).txt | awk -F'|' '{print $8}')"
  grep -E "stamps +([0-9]|1[0-4]|7[5-9]|80) " $OUT/stamps-$(basename $m .gguf).txt
done
date +%T

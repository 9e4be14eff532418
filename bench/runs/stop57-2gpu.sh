#!/usr/bin/env bash
# Stop 57, a machine of two GPUs (any): `ferry devices`, test_cuda's two-GPU tests (bytes
# between the GPUs both ways with the copy's speed; a model split over both gives one GPU's
# logits bit for bit), then the whole of test_cuda, and 1B Q4_0 / F16 `ferry bench -p 512 -n
# 128 -r 3` on CUDA0 | split over CUDA0,CUDA1 | CUDA1, and served (`ferry serve` of both: the
# client's device list). Prediction: the split's tg128 ~0.9-0.97 of one GPU's (one hand-over
# of 8 KiB a token, the two halves in turn; no overlap at batch 1).
# Binaries of main at 36c26d8 (.dev57: ferry.xz, test_cuda.xz, fx.tar.xz). Carry [".dev57"].
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -6
BIN=${BIN:-.dev57} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
$F devices
(gen_models) > /dev/null 2>&1 &
GEN=$!
tests "*TwoGpus*" $(cap 120)
grep "cuda     \]" $OUT/test_cuda.*.txt | head
tests "*" $(cap 200)
wait $GEN
for m in $Q $H; do
  for d in CUDA0 CUDA0,CUDA1 CUDA1; do
    left 40 "bench $(basename $m) $d" || break
    echo "--- $(basename $m) on $d"
    $F bench -m $m --device $d -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128|memory|weights read"
  done
done
$F serve --listen unix:$SD/u > $SD/u.log 2>&1 &
SERVER_PIDS+=($!)
sleep 2
$F devices --remote unix:$SD/u
left 40 "served split" && echo "served split tg128: $(bt $Q --remote unix:$SD/u --device unix:$SD/u/CUDA0,unix:$SD/u/CUDA1)"
date +%T

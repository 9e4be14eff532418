#!/usr/bin/env bash
# Run D (stop 26): the streaming form's grid at one block per SM (a block of the next kernel
# fits beside each, so PDL can start its weight loads early) against two. Carry [".devbin"].
# FERRY_CUDA_MV_STREAM_BLOCKS exists at commit 6363978 only (removed after this run: slower).
BIN=.devbin
source bench/runs/common.sh
gen_models
echo "=== $(date -u +%T) tg128, FERRY_CUDA_MV_STREAM_BLOCKS=1 against the default 2"
for r in 1 2 3; do
  echo "f16 2: $(tg $H 128)   f16 1: $(tg $H 128 FERRY_CUDA_MV_STREAM_BLOCKS=1)"
  echo "q4_0 2: $(tg $Q 128)   q4_0 1: $(tg $Q 128 FERRY_CUDA_MV_STREAM_BLOCKS=1)"
done
echo "tiny q8_0: $(tg $T 128)  tiny f16: $(tg $BIN/fx/tiny-llama-f16.gguf 128)  tiny f16 1: $(tg $BIN/fx/tiny-llama-f16.gguf 128 FERRY_CUDA_MV_STREAM_BLOCKS=1)"
echo "=== $(date -u +%T) done"

#!/usr/bin/env bash
# Stop 47, call B: the mirror's row counts as a gpu-scope release and one system fence a step
# (stop47-a's form 4, now the code's own). Local 1B Q4_0 tg128 with pieces forced on and
# nobody reading still ran 4.8% under none in call A: what is left, by probe (measurement
# only, bench/runs/stop47-mirror-probe.patch): 1 no row stores, 2 no counts, 3 neither (the
# mirrored walk alone). Then served side by side, three rounds, and test_cuda whole.
# Carry [".dev24"].
BIN=.dev24 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
M=FERRY_CUDA_PIECES=8
echo "--- local, nobody reading: none | mirrored | probe 1 (no stores) | 2 (no counts) | 3 (walk alone) | cut"
bt $Q --device CUDA0 > /dev/null
for r in 1 2; do
  echo "$(bt $Q --device CUDA0) | $(be $M) | $(be $M FERRY_CUDA_MIRROR_PROBE=1) | $(be $M FERRY_CUDA_MIRROR_PROBE=2) | $(be $M FERRY_CUDA_MIRROR_PROBE=3) | $(be $M FERRY_CUDA_PIECE_CUT=1)"
done
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
echo "--- served: local | unix | tcp"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
for r in 1 2 3; do
  left 30 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
left 100 "test_cuda" || exit 0
tests "*" $(cap 150)

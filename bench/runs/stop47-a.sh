#!/usr/bin/env bash
# Stop 47, call A: stop 46's call C (H100) put the tcp shortfall in the host mirror's fences:
# served tcp / local 0.920 with fence.sc.sys a warp's run (G 8), 0.944 at G 16, 0.961 with no
# fence (unsafe), acq_rel.sys no better than sc. Here the forms that keep the ordering with
# one system fence a step (the completing warp's) and gpu-scope fences a run (mirror fence 3:
# every lane, 4: lane 0 after the warp's barrier), against 0 (now), 2 and 5 (unsafe, cost
# only): local with pieces forced and nobody reading, then served side by side, then the
# served tests in forms 3 and 4. Knobs: stop46-mirror-knobs.patch plus the fence forms 3-5.
# Carry [".dev23"].
BIN=.dev23 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
M=FERRY_CUDA_PIECES=8
echo "--- local, nobody reading: none | F0 G8 | F3 G8 | F4 G8 | F5 G8 | F2 G8 | F4 G16"
bt $Q --device CUDA0 > /dev/null
for r in 1 2; do
  echo "$(bt $Q --device CUDA0) | $(be $M) | $(be $M FERRY_CUDA_MIRROR_FENCE=3) | $(be $M FERRY_CUDA_MIRROR_FENCE=4) | $(be $M FERRY_CUDA_MIRROR_FENCE=5) | $(be $M FERRY_CUDA_MIRROR_FENCE=2) | $(be $M FERRY_CUDA_MIRROR_FENCE=4 FERRY_CUDA_MIRROR_GROUP=16)"
done
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_MIRROR_FENCE=3
serve_tcp 2 FERRY_CUDA_MIRROR_FENCE=4
serve_tcp 3 FERRY_CUDA_MIRROR_FENCE=4 FERRY_CUDA_MIRROR_GROUP=16
serve_tcp 4 FERRY_CUDA_MIRROR_FENCE=5
serve_tcp 5 FERRY_CUDA_MIRROR_FENCE=2
echo "listening: $(servers_up)"
echo "--- served: local | unix | tcp F0 G8 | F3 G8 | F4 G8 | F4 G16 | F5 G8 | F2 G8"
for k in 0 1 2 3 4 5; do bt $Q --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
for r in 1 2 3; do
  left 50 "served round $r" || break
  row="$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u)"
  for k in 0 1 2 3 4 5; do row="$row | $(bt $Q --remote tcp:127.0.0.1:$((P + k)))"; done
  echo "$row"
done
left 40 "the served tests, fence 4" || exit 0
FERRY_CUDA_MIRROR_FENCE=4 tests "*Served*:*Progressive*" $(cap 90)
left 40 "the served tests, fence 3" || exit 0
FERRY_CUDA_MIRROR_FENCE=3 tests "*ServedTcpLogits*" $(cap 60)

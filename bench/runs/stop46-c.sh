#!/usr/bin/env bash
# Stop 46, call C: call B's step trace put a tcp step's last mirrored piece 25-28 us after a
# unix step's whole end (its 513 KB device-to-host copy included), the pieces spread over
# ~100 us where the Q6_K output product alone takes ~70: the host mirror's system-scope fence
# (one a warp and run of G = 8 rows, ~8 a warp) is the suspect. Here, 1B Q4_0 tg128:
# local with pieces forced on nobody reading them (FERRY_CUDA_PIECES=8) in each form (mirror
# G 8 / 16 / 32, fence.acq_rel.sys, no fence (unsafe, cost only), the cut form) against none;
# then tcp servers of the forms side by side. The knobs: bench/runs/stop46-mirror-knobs.patch
# (against 68d6b5a). Carry [".dev22"].
BIN=.dev22 source bench/runs/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gen_models
M=FERRY_CUDA_PIECES=8
echo "--- local, nobody reading: none | mirror G8 | G16 | G32 | acq_rel | no fence | cut"
bt $Q --device CUDA0 > /dev/null
for r in 1 2; do
  echo "$(bt $Q --device CUDA0) | $(env $M bt $Q --device CUDA0) | $(env $M FERRY_CUDA_MIRROR_GROUP=16 bt $Q --device CUDA0) | $(env $M FERRY_CUDA_MIRROR_GROUP=32 bt $Q --device CUDA0) | $(env $M FERRY_CUDA_MIRROR_FENCE=1 bt $Q --device CUDA0) | $(env $M FERRY_CUDA_MIRROR_FENCE=2 bt $Q --device CUDA0) | $(env $M FERRY_CUDA_PIECE_CUT=1 bt $Q --device CUDA0)"
done
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_MIRROR_GROUP=16
serve_tcp 2 FERRY_CUDA_MIRROR_GROUP=32
serve_tcp 3 FERRY_CUDA_MIRROR_FENCE=1
serve_tcp 4 FERRY_CUDA_PIECE_CUT=1
serve_tcp 5 FERRY_CUDA_MIRROR_FENCE=2
echo "listening: $(servers_up)"
echo "--- served: local | unix | tcp G8 | G16 | G32 | acq_rel | cut | no fence"
for k in 0 1 2 3 4 5; do bt $Q --remote tcp:127.0.0.1:$((P + k)) > /dev/null; done
for r in 1 2; do
  left 50 "served round $r" || break
  row="$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u)"
  for k in 0 1 2 3 4 5; do row="$row | $(bt $Q --remote tcp:127.0.0.1:$((P + k)))"; done
  echo "$row"
done
left 40 "the served test with G 16 and fence.acq_rel.sys" || exit 0
FERRY_CUDA_MIRROR_GROUP=16 FERRY_CUDA_MIRROR_FENCE=1 tests "*ServedTcpLogits*" $(cap 60)

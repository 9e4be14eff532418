#!/usr/bin/env bash
# Run I (stop 30): where the progressive copies' GPU cost comes from. Local 1B Q4_0 tg128 with
# nobody reading, pieces forced on a local backend: no pieces | 8 copied | 8 cut, not copied;
# with programmatic dependent launch on (the default) and off (FERRY_CUDA_PDL=0). If the copies
# cost nothing more than the cut with PDL off, their cost with it on is the PDL overlap the
# copy branches take away between the pieces' launches.
# .devI holds ferry.xz; carry [".devI"].
BIN=.devI
source bench/runs/common.sh
gen_models
for r in 1 2; do
  echo "pdl on:  $(R=3 tg $Q 128) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_COPIES=0)"
  echo "pdl off: $(R=3 tg $Q 128 FERRY_CUDA_PDL=0) $(R=3 tg $Q 128 FERRY_CUDA_PDL=0 FERRY_CUDA_PIECES=8) $(R=3 tg $Q 128 FERRY_CUDA_PDL=0 FERRY_CUDA_PIECES=8 FERRY_CUDA_PIECE_COPIES=0)"
done
echo "=== $(date -u +%T) done"

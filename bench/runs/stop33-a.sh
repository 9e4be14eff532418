#!/usr/bin/env bash
# (stop33-bulk.patch landed in stop 35, commit e1936d9: the bulk form is main's, on by default for
# F16/BF16. The patch itself: `git show ed37fd5:bench/runs/stop33-bulk.patch`.)
# Run A (stop 33, prepared in a session without device time; not yet run): the binaries of
# main + bench/runs/stop33-bulk.patch + bench/runs/stop32-unix-pieces.patch (each off unless
# asked for: FERRY_CUDA_MV_BULK=S, FERRY_CUDA_MV_BULK_Q=S, FERRY_SERVE_UNIX_PIECES=1).
#  1. test_cuda: the bulk form against the register form bit for bit (products, f16 and q4_0
#     decode), the progressive tests (acb9c21's mirror launch, the plain Q6_K case, the bulk
#     mirror), the served tests (the unix-pieces server), the streaming-form tests.
#  2. The floor with a shared-memory footprint per block (bench_cuda_floor f16 100 KIB): up
#     to which footprint a chain of streaming kernels keeps its PDL overlap.
#  3. 1B F16 tg128 side by side, three rounds: the register form against the bulk form with
#     S = 4 slots a warp and FIT=0 (128 KiB in flight a block: no room for the next kernel's
#     block, the control), 3 (96 KiB: two consecutive kernels' blocks fit an SM; down 2),
#     3 with down's b read from global memory (XGLOBAL: down keeps 3, ~28 KiB of L1 for its
#     32 KiB of b), 2 (64 KiB), and S = 2 / 1 with two blocks per SM.
#  4. 1B Q4_0 tg128 side by side, three rounds: the register form (Q4_0 wo/down in 16-warp
#     blocks) against BULK_Q = 8 (one 8-warp block an SM, 72 KiB in flight, as the register
#     form's SM), 12, and 4 with two blocks per SM.
# Prediction (written before any run): F16 S = 4 within 3% of the register form (same bytes in
# flight, no overlap); S = 3 faster, 1,200-1,250 t/s against ~1,105, if the floor keeps its
# overlap at ~110 KiB a block; S = 2 between. Q4_0: BULK_Q = 8 within 5% either way (8 warps
# an SM may issue too few dp4a; the overlap may pay for it).
# .devA holds ferry.xz, test_cuda.xz, fx.tar.xz and bench_cuda_floor; carry [".devA"].
BIN=${BIN:-.devA}
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda: bulk (alone first: a hang costs 240 s, not the run)"
tests "*BulkStream*" 240
echo "=== $(date -u +%T) test_cuda: progressive, served, streaming"
tests "${FILTER:-*Progressive*:*Served*:*Stream*-*BulkStream*}" 300
echo "=== $(date -u +%T) floor, f16, shared memory per block 0 / 96 / 120 / 200 KiB"
for k in 0 96 120 200; do timeout 30 $BIN/bench_cuda_floor f16 100 $k 2>&1 | sed "s/^/[$k KiB] /"; done
wait
echo "=== $(date -u +%T) 1B F16 tg128: register | bulk S=4 unfit | S=3 | S=3 b global | S=2 |" \
  "S=2 x2 blocks | S=1 x2"
bt $H --device CUDA0 > /dev/null
for r in 1 2 3; do
  echo "$(bt $H --device CUDA0) $(FERRY_CUDA_MV_BULK=4 FERRY_CUDA_MV_BULK_FIT=0 bt $H --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK=3 bt $H --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK=3 FERRY_CUDA_MV_BULK_XGLOBAL=1 bt $H --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK=2 bt $H --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK=2 FERRY_CUDA_MV_BULK_BLOCKS=2 bt $H --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK=1 FERRY_CUDA_MV_BULK_BLOCKS=2 bt $H --device CUDA0)"
done
echo "=== $(date -u +%T) 1B Q4_0 tg128: register | BULK_Q=8 | 12 | 4 x2 blocks"
bt $Q --device CUDA0 > /dev/null
for r in 1 2 3; do
  echo "$(bt $Q --device CUDA0) $(FERRY_CUDA_MV_BULK_Q=8 bt $Q --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK_Q=12 bt $Q --device CUDA0)" \
    "$(FERRY_CUDA_MV_BULK_Q=4 FERRY_CUDA_MV_BULK_BLOCKS=2 bt $Q --device CUDA0)"
done
echo "=== $(date -u +%T) done"

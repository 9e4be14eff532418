#!/usr/bin/env bash
# Run C of stop 40 (the review): k_mv_stream and bulk_rows on one sum cursor (ItemSums: the
# item/row/piece cursor, the row sums, the lanes' sum and the epilogue, which both loops wrote
# out alike). Their sm_90 code differs from head's in 24 of 28 kernels (register allocation and
# order; +-80 instructions), so: the product-form tests (bit for bit against the other forms
# and the CPU), then 1B F16 and Q4_0 tg128 with head's ferry (ferry-old.xz, built from the
# removal, 3d8bb59's device code) and the new one, alternating, four rounds.
# Carry [".devE"] (ferry.xz, test_cuda.xz, ferry-old.xz). The change: stop40-itemsums.patch
# (not applied: ran once, 2026-12-06, H100; bench/results/cuda.md, stop 40, call 14).
BIN=${BIN:-.devE}
source bench/runs/common.sh
unpack ferry-old
gen_models &
echo "=== $(date -u +%T) test_cuda"
tests "${FILTER:-*BulkStream*:*StreamProducts*:*WideStream*:*FoldedNorm*:*FusedKernelsNever*}" $(cap 150)
wait
echo "=== $(date -u +%T) tg128: F16 old | new || Q4_0 old | new"
for r in 1 2 3 4; do
  left 25 "round $r" || break
  o=$(F=/tmp/ferry-old bt $H --device CUDA0) n=$(bt $H --device CUDA0)
  qo=$(F=/tmp/ferry-old bt $Q --device CUDA0) qn=$(bt $Q --device CUDA0)
  echo "round $r: $o | $n || $qo | $qn"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

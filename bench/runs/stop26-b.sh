#!/usr/bin/env bash
# Run B (stop 26): every test_cuda test but the ring-form comparisons (run A ran those) with
# every tiny-llama fixture carried, and ncu's per-kernel times of the 1B F16 and Q4_0 decode.
# .devF holds ferry.xz and test_cuda.xz (xz of bench/build-for-device.sh's binaries) and fx/
# (the fixtures the tests read); run from the repository root with carry [".devF"].
BIN=.devF
source bench/runs/common.sh
gen_models &
echo "=== $(date -u +%T) test_cuda, every test but RingProducts* and the q4_1 oracle case (fixture not carried: the 64 MiB carry)"
timeout 330 $TC --gtest_filter='-*RingProducts*:*q4_1*' > $OUT/test_cuda.txt 2>&1
grep -E "^\[ cuda|FAILED|Failure|PASSED|tests ran" $OUT/test_cuda.txt | head -60
wait
echo "=== $(date -u +%T) ncu decode kernels"
for m in $H $Q; do
  b=$(basename $m .gguf)
  timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --csv --print-units base --launch-skip 600 --launch-count 300 $F bench -m $m --device CUDA0 -p 0 -n 8 -r 1 \
    > $OUT/ncu-$b.csv 2> $OUT/ncu-$b.err
  python3 bench/ncu-summary.py $OUT/ncu-$b.csv 2>&1 | head -20
done
echo "=== $(date -u +%T) done"

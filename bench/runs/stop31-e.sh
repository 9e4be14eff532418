#!/usr/bin/env bash
# Run E (stop 31): the mirror with rows in order: the streaming kernel's warps take runs of
# 16 rows when mirrored, each run written as one 64-byte line into each half (no partial
# lines), and the host sends straight from the half (runs C and D put 8-row groups of W
# writers in order on the host, and tcp fell to 0.73 / 0.54 of local, while the GPU cost fell
# to nothing with whole lines in run D). Prediction: GPU cost <= 1% (load imbalance of 16-row
# runs), tcp >= 0.92 of local.
# .devE holds ferry.xz and test_cuda.xz; carry [".devE"]. The commands are run C's.
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devE FILTER='*Progressive*:*Served*' bash bench/runs/stop31-c.sh

#!/usr/bin/env bash
# Run D (stop 31): run C's mirror with each writer's group written as one 64-byte line (its
# rows into the run's half, kMirrorEmpty into the other: no partial-line writes) and a reader
# that pauses between polls. Run C: the 32-byte writes cost the GPU ~13 us a step with nobody
# reading, and tcp fell to 0.73 of local with a reader polling them (cut form 0.91).
# Prediction: with whole lines the polled writes stop costing; tcp >= 0.92.
# .devD holds ferry.xz and test_cuda.xz; carry [".devD"]. The commands are run C's.
# Ran a build of this stop's host-mirror experiment (not on main; runs E-G's form is
# bench/runs/stop31-mirror.patch): bench/results/cuda.md, stop 31.
BIN=.devD FILTER='*Progressive*:*Served*' bash bench/runs/stop31-c.sh

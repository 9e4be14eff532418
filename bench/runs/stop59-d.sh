#!/usr/bin/env bash
# Stop 59, call D (the session's last device seconds): the F16 target, on an H200 only (an H100
# ends at once: its figures are in calls A-C). Binary of main at 15633df (.dev59d/ferry.xz, stop
# 58's .dev58 build; main's code since differs in `ferry bench`'s internals only; carry
# [".dev59d"]). 1B F16 tg128 plan | default, three rounds (prediction ~1,335: stop 53's 1,314
# x1.017 for the logits' store); bench tables with memory and bandwidth; test-ops; served rounds.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
[[ $CARD == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
BIN=${BIN:-.dev59d} source bench/runs/common.sh
date +%T
gen_models
plan_rounds 3
bench_tables 5 $H $Q
test_ops
servers_start
served_rounds 3
date +%T

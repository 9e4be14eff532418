#!/usr/bin/env bash
# Run D (stop 35): run C's build (the bulk form on by default for F16/BF16), every test_cuda
# test that run C did not run, with every tiny-llama fixture (fx.tar.xz and fx2.tar.xz).
BIN=${BIN:-.devB}
source bench/runs/common.sh
echo "=== $(date -u +%T) test_cuda: all but run C's"
tests "${FILTER:-*-*Progressive*:*StreamProducts*:*WideStream*:*BulkStream*:*Served*}" 420
echo "=== $(date -u +%T) done"

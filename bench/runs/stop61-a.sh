#!/usr/bin/env bash
# Stop 61, call A (carry [".dev59d", ".dev59b"]): on an H200, stop60-a.sh whole (the F16 target,
# the copies in flight, bench tables, the served rounds, test-ops, the stamps: that script's
# header says why). On any other card it stops at once: every figure it would give there was
# measured on H100s in stops 55-59 with the same CUDA code, and the session's device time is
# kept for another try at an H200 (stops 54-60 got none).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "card: $CARD"
if [[ $CARD != *H200* ]]; then
  echo "not an H200: nothing run"
  exit 0
fi
exec bash bench/runs/stop60-a.sh

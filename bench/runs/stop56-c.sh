#!/usr/bin/env bash
# Stop 56, calls C on: stop56-b.sh on an H200 alone, with the copies in flight swept wider
# (the H200 streams 1.4x an H100's bytes; 6,2 and 8,2 added); on any other card the card's name
# and nothing more (a start costs ~80 s of device time; the run itself then ~1 s).
# Carry [".dev56b"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
[[ $CARD == *H200* ]] || { echo "$CARD: not an H200, nothing run"; exit 0; }
SWEEP="2,1 4,1 4,2 6,2 8,2 3,2" bash bench/runs/stop56-b.sh

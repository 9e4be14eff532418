#!/usr/bin/env bash
# Stop 42, call A: stop 41's prepared rope-early patch (bench/runs/stop41-rope-early.patch,
# built into .dev1 with its tests and fixtures; main's ferry.xz in .devM), run by stop41-i.sh
# (its prediction: q/k/v -0.5 to -1 us a layer, 1B F16 tg128 +1-1.5%). Then, main's binary:
# where the host's time between steps goes (session profile and graph stats), F16 and Q4_0,
# for the next lead (the host's ~16-21 us a step with nothing queued on the GPU).
# Carry [".dev1", ".devM"].
BIN=.dev1 bash bench/runs/stop41-i.sh
BIN=.dev1 source bench/runs/common.sh
echo "=== $(date -u +%T) host profile, main's binary"
for m in $H $Q; do
  echo "--- $(basename $m)"
  FERRY_SESSION_PROFILE=1 FERRY_CUDA_GRAPH_STATS=1 /tmp/ferry-old bench -m $m --device CUDA0 -p 0 -n 128 -r 3 2>&1 |
    grep -E "tg128|session profile|graph|replay|key" | head -12
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

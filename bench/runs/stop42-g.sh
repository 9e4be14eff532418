#!/usr/bin/env bash
# Stop 42, call G: where tcp's share goes for 1B Q4_0 (call F, H100: local 1,707-1,715 t/s, unix
# 0.978, tcp 0.909; F16 tcp 0.976). Q4_0's logits product is short (~70 us against F16's ~160),
# so the 513 KB of logits a token may not cross the loopback within it: the client's stripe
# connections (FERRY_REMOTE_STRIPES, 2 by default on this host) side by side, 1, 2, 4 and 8,
# against local, after warm-up runs. Prediction (written before the run): 4 stripes 0.93-0.95,
# 8 no better than 4.
# Carry [".dev4"].
BIN=.dev4 source bench/runs/common.sh
gen_models
serve_tcp 0
echo "listening: $(servers_up)"
tcpk() { FERRY_REMOTE_STRIPES=$1 bt $Q --remote tcp:127.0.0.1:$P; }
bt $Q --device CUDA0 > /dev/null; tcpk 2 > /dev/null
echo "=== $(date -u +%T) Q4_0 tg128: local | tcp 1 | 2 | 4 | 8 stripes"
for r in 1 2 3 4; do
  left 60 "round $r" || break
  echo "round $r: $(bt $Q --device CUDA0) | $(tcpk 1) | $(tcpk 2) | $(tcpk 4) | $(tcpk 8)"
done
echo "=== $(date -u +%T) done at ${SECONDS}s"

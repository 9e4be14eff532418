#!/usr/bin/env bash
# Run B (stop 32): where the served tcp step's time goes with run A's flagged mirror. Servers
# with FERRY_SERVE_PIECE_TRACE=1 print, per client connection, the medians of their
# progressive replies' timeline (when each piece was handed over, when stripe 0 and the lanes
# had sent all); side by side: tcp to mirror servers, cut servers, mirror on one connection;
# clients with 4 stripes; profiled clients (the logits read's median host time).
# .devB holds ferry.xz; carry [".devB"].
BIN=${BIN:-.devB}
source bench/runs/common.sh
gen_models
serve_unix
serve_tcp 0 FERRY_SERVE_PIECE_TRACE=1
serve_tcp 1 FERRY_SERVE_PIECE_TRACE=1 FERRY_CUDA_PIECE_CUT=1
serve_tcp 2 FERRY_SERVE_PIECE_TRACE=1 FERRY_SERVE_PIECE_STRIPES=0
echo "=== $(date -u +%T) servers: $(servers_up)"
side_by_side "tcp-mirror tcp-cut tcp-mirror-one-connection" "0 1" "0 1 2" 3
echo "=== $(date -u +%T) 1B Q4_0, clients with 4 stripes: local unix tcp-mirror tcp-cut"
for r in 1 2; do
  echo "$(bt $Q --device CUDA0) $(bt $Q --remote unix:$SD/u) $(FERRY_REMOTE_STRIPES=4 bt $Q --remote tcp:127.0.0.1:$P) $(FERRY_REMOTE_STRIPES=4 bt $Q --remote tcp:127.0.0.1:$((P + 1)))"
done
echo "=== $(date -u +%T) profiled clients (1B Q4_0): logits read"
logits_reads 'medians.*' unix:$SD/u tcp:127.0.0.1:$P tcp:127.0.0.1:$((P + 1)) tcp:127.0.0.1:$((P + 2))
echo "=== $(date -u +%T) server traces (one line per client connection)"
for k in 0 1 2; do echo "--- tcp server $k"; grep -h "progressive replies" $SD/t$k.log | cut -c1-400; done
echo "=== $(date -u +%T) done"

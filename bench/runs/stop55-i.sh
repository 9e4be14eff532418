#!/usr/bin/env bash
# Stop 55, call I: after call H (H100: the served tests pass; served Q4_0 unix 0.963-0.977, tcp
# 0.935-0.947 of a local that the logits' store made 2.5% faster), does a unix server's step
# store the client's logits into its shared memory? Servers with FERRY_CUDA_GRAPH_STATS=1 (the
# reads the step stored itself, printed when the session's backend goes), a 1B Q4_0 client
# each, then served_rounds 4. Prediction: the unix server stores ~every read (tcp's are
# progressive, none), and unix sits at ~0.98 of local.
# .dev55: ferry.xz. Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gen_models
serve_unix FERRY_CUDA_GRAPH_STATS=1
serve_tcp 0 FERRY_CUDA_GRAPH_STATS=1
echo "listening: $(servers_up)"
echo "unix $(bt $Q --remote unix:$SD/u) tcp $(bt $Q --remote tcp:127.0.0.1:$P)"
sleep 1
grep -h "graph stats" $SD/*.log | tail -4
served_rounds 4
date +%T

#!/usr/bin/env bash
# (Ran at 75eb56f on an H200, 05:55 UTC: bench/results/cuda.md, stop 53, call A.)
# Stop 53, call A: the persistent step's first run (stop 52's binaries never ran it: the
# out_ids row fixed since, and blocks with no tiles of a phase no longer read its input). Its
# two tests, why a 1B F16 graph is or is not lowered, 1B F16 tg128 off (FERRY_CUDA_PERSIST=0)
# / on, three rounds side by side; then the whole of test_cuda with the step on (every decode
# test of every model lowers correctly or falls back), test-ops; with the time left, 1B Q4_0
# local | unix | tcp through `ferry serve` and served F16 with the server's step off / on.
# Prediction (stop 51-d's prototype on an H100): tg128 t/s x 1.11-1.15 with the step on.
# .dev52: ferry.xz, test_cuda.xz, fx.tar.xz (the tiny-llama fixtures but q4_1 and q5_k_m).
# Carry [".dev52"].
BIN=${BIN:-.dev52} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
$F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1 &
GEN=$!
tests 'Cuda.Persistent*' $(cap 150)
grep "persistent decode vs\|persistent decode queued\|not one persistent" $OUT/test_cuda.*.txt | sort | uniq -c | head -20
wait $GEN
date +%T
left 40 "why" && FERRY_CUDA_PERSIST=1 FERRY_CUDA_PERSIST_WHY=1 timeout 40 $F bench -m $H --device CUDA0 -p 0 -n 16 -r 1 2>&1 |
  grep -E "persistent|tg16|rror" | sort | uniq -c | head
for r in 1 2 3; do
  left 40 "round $r" || break
  echo "round $r plan: $(FERRY_CUDA_PERSIST=0 bt $H --device CUDA0)  persistent: $(FERRY_CUDA_PERSIST=1 bt $H --device CUDA0)"
done
date +%T
(export FERRY_CUDA_PERSIST=1; tests "*" $(cap 220))
date +%T
left 120 "served" || exit 0
$F gen-model --preset llama-3.2-1b --type q4_0 -o $Q > /dev/null 2>&1
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_PERSIST=0
serve_tcp 2 FERRY_CUDA_PERSIST=1
echo "listening: $(servers_up)"
served_rounds 3
echo "--- served F16 over tcp: server plan | server persistent"
for r in 1 2; do
  left 30 "served F16 round $r" || break
  echo "$(bt $H --remote tcp:127.0.0.1:$((P + 1))) | $(bt $H --remote tcp:127.0.0.1:$((P + 2)))"
done
left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 2; }
date +%T

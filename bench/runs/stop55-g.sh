#!/usr/bin/env bash
# Stop 55, calls G-H: call F's one failure, Cuda.ServedStepsQueuedAheadGiveTheSameBits: the unix
# server lost the connection at the first step whose logits its last product stored into the
# client's shared memory. Call G (this script, with the memory registered mapped and a store
# only where cudaHostGetDevicePointer maps the address) showed the server segfaulting: the
# backend kept the read's Tensor pointer, a server's temporary, and the next queued launch
# read it. Call H: reads kept by device address. First a unix server and a tiny-llama F16
# client by hand (the server's log and state shown), then the served and queued-ahead tests,
# then served 1B Q4_0 local | unix | tcp (the unix server's read now stored by the step:
# prediction unix 0.98-0.99 of local).
# .dev55: ferry.xz, test_cuda.xz, fx.tar.xz. Carry [".dev55"].
BIN=${BIN:-.dev55} source bench/runs/common.sh
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gen_models > /dev/null 2>&1 &
GEN=$!
TF=../shared/fixtures/tiny-llama/tiny-llama-f16.gguf
$F serve --listen unix:$SD/d --device CUDA0 > $SD/d.log 2>&1 &
DP=$!
sleep 2
timeout 60 $F bench -m $TF --remote unix:$SD/d -p 0 -n 64 -r 2 2>&1 | tail -3
sleep 0.5
if kill -0 $DP 2>/dev/null; then echo "server alive"; kill $DP; else wait $DP; echo "server exited: $?"; fi
cat $SD/d.log | tail -5
tests "Cuda.ServedSteps*:Cuda.StepsQueued*:Cuda.Persistent*:Cuda.Progressive*:Cuda.ServedTcp*" $(cap 150)
grep "logits stored into the read" $OUT/test_cuda.*.txt | head -4
wait $GEN
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
served_rounds 3
date +%T

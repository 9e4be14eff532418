#!/usr/bin/env bash
# Stop 48, call C: HEAD (c217a21) plus the mirror's deferred counts (HostMirror::defer: lane 0's
# fence and count of a run after the warp's next row, its look at the count after the row
# after; FERRY_CUDA_MIRROR_DEFER=0: at once, as before). Prediction: the mirror's local cost
# (Q4_0 pieces forced on, nobody reading) 4.8% -> ~3.5%, tcp +1-1.5% of local. In order of
# need (device time was short): the served and progressive tests (the tcp logits bit for bit
# local's, with the mirror deferred); local with pieces forced, deferred | at once | none;
# served side by side (local | unix | tcp | tcp at once); a tcp step trace with the stripe
# lanes; local rounds; then the rest of test_cuda (but the q4_1 / q5_k_m fixtures', not
# carried) and test-ops. Carry [".dev28"].
# Ran on an H100 (after ~100 s to start) and hit the call's 600 s limit with its output still in
# grep's pipe (hence run.log in common.sh now): its served tests' file and the step trace came
# back. The A/B rows of bench/results/cuda.md came from two short calls on the same warm machine
# (the forced and served loops above, 4 and 6 rounds).
BIN=${BIN:-.dev28} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
tests "*Served*:*Progressive*" $(cap 150)
gen_models
echo "--- Q4_0 local, pieces forced (nobody reading): deferred | at once | none"
for r in 1 2; do
  left 30 "forced round $r" || break
  echo "$(be FERRY_CUDA_PIECES=8) | $(be FERRY_CUDA_PIECES=8 FERRY_CUDA_MIRROR_DEFER=0) | $(be FERRY_CUDA_PIECES=0)"
done
serve_unix
serve_tcp 0
serve_tcp 1 FERRY_CUDA_MIRROR_DEFER=0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
bt $Q --remote tcp:127.0.0.1:$((P + 1)) > /dev/null
echo "--- served Q4_0: local | unix | tcp | tcp at once"
for r in 1 2 3 4; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(bt $Q --remote unix:$SD/u) | $(bt $Q --remote tcp:127.0.0.1:$P) | $(bt $Q --remote tcp:127.0.0.1:$((P + 1)))"
done
left 40 "step trace" && tcp_step_trace
left 60 "local rounds" && { gen_types bf16; local_rounds 1; }
left 90 "the rest of test_cuda" && tests "-*Served*:*Progressive*" $(cap 200)
left 40 "test-ops" && { timeout $(cap 90) $F test-ops --backend CUDA0 2>&1 | tail -n 2; }

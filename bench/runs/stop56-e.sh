#!/usr/bin/env bash
# Stop 56, call E (any card). On an H200 first: the F16 target (1B F16 tg128 plan | default,
# three rounds), the copies in flight swept, `ferry bench -p 512 -n 128 -r 5` for F16, BF16 and
# Q4_0 (with bench's GPU memory line). Then on any card: the whole of test_cuda and test-ops
# (the BF16 step, the shared run_stash, out_step_ set at its push); served 1B Q4_0 tg128,
# local | unix held | unix | tcp held | tcp (held: FERRY_REMOTE_SEND_EARLY=0, the step's send
# after compute_ahead's compare as before), three rounds; each transport's step trace; on an
# H100 bench's memory line for F16 and BF16.
# Prediction: the client's gap from the read's reply to the next send 5.7 -> ~1-2 us (unix),
# 11 -> ~6 (tcp): unix ~+0.7%, tcp ~+0.8%.
# Binaries of this commit (.dev56c: ferry.xz, test_cuda.xz, fx.tar.xz). Carry [".dev56c"].
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$CARD"
BIN=${BIN:-.dev56c} source bench/runs/common.sh
# (fx.tar.xz holds every tiny-llama fixture but the Q8_0 file: the repository's models/ copy.)
for d in /work/shared/fixtures/tiny-llama ../shared/fixtures/tiny-llama; do
  cp models/tiny-llama-q8_0.gguf $d/
done
tables() {
  for m in "$@"; do
    left 40 "bench $(basename $m)" || break
    $F bench -m $m --device CUDA0 -p 512 -n 128 -r ${BR:-5} 2>&1 | grep -E "pp512|tg128|peak|memory"
  done
}
if [[ $CARD == *H200* ]]; then
  gen_models
  gen_types bf16
  for r in 1 2 3; do
    left 30 "F16 round $r" || break
    echo "F16 tg128 plan | default: $(tg $H 128 FERRY_CUDA_PERSIST=0) | $(tg $H 128)"
  done
  row="F16 tg128 inflight"
  for k in 2,1 4,1 4,2 6,2 8,2; do row="$row | $k $(tg $H 128 FERRY_CUDA_PERSIST_INFLIGHT=$k)"; done
  echo "$row"
  tables $H /tmp/bf16.gguf $Q
  date +%T
fi
(gen_models; gen_types bf16) > /dev/null 2>&1 &
GEN=$!
tests "*" $(cap 200)
left 40 "test-ops" && { timeout $(cap 60) $F test-ops --backend CUDA0 2>&1 | tail -n 1; }
wait $GEN
date +%T
held() { (export FERRY_REMOTE_SEND_EARLY=0; bt "$@"); }
serve_unix
serve_tcp 0
echo "listening: $(servers_up)"
bt $Q --remote tcp:127.0.0.1:$P > /dev/null
echo "--- served Q4_0: local | unix held | unix | tcp held | tcp"
for r in 1 2 3; do
  left 40 "served round $r" || break
  echo "$(bt $Q --device CUDA0) | $(held $Q --remote unix:$SD/u) | $(bt $Q --remote unix:$SD/u) | $(held $Q --remote tcp:127.0.0.1:$P) | $(bt $Q --remote tcp:127.0.0.1:$P)"
done
left 40 "unix trace" && step_trace unix
left 40 "tcp trace" && step_trace tcp
[[ $CARD == *H200* ]] || BR=3 tables $H /tmp/bf16.gguf
date +%T

#!/usr/bin/env bash
# Stop 51, call C: the attention's cached keys and values loaded into registers before its wait
# for q (11th argument, default on; stop 51-b's table, H100: the attention phase 6.66 us a
# layer, its arithmetic after the input up to 5.6 us: three dependent rounds of cache loads).
# Beside it off, on stop 51-b's best forms (consecutive tiles; 2 copies in flight, or 3 with 1
# in the chain), with 256 keys (held early) and 512 (too many: loaded after), then the floor
# and ferry's F16 tg128 on the same card.
# Prediction: the attention phase 6.7 -> ~2.5 us, the step -4-7% (H100 ~860, H200 ~720).
# .dev51: bench_cuda_persist.xz (this form), bench_cuda_floor.xz, ferry.xz. Carry [".dev51"].
BIN=${BIN:-.dev51} source bench/runs/common.sh
unpack bench_cuda_persist bench_cuda_floor
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
P=/tmp/bench_cuda_persist
# run ARGS: the persistent form's line (the other forms' too when FULL=1, and the stamped table).
run() {
  left 20 "$*" || return
  if [ "${FULL:-0}" = 1 ]; then
    timeout 20 $P 50 16 "$@" | grep --line-buffered -v "^check.*(ok)$" || echo "(rc $?)"
  else
    timeout 20 $P 50 16 "$@" | grep --line-buffered -E "^persistent|FAILED|^check: " || echo "(rc $?)"
  fi
}
FULL=1 run 64 1 1 2 2 0 1 0 1
run 64 1 1 2 2 0 1 0 0
run 64 1 1 3 1 0 1 0 1
run 64 1 1 3 1 0 1 0 0
run 64 1 1 2 2 0 2 0 1
run 64 1 1 3 3 0 1 0 1
run 64 1 1 2 1 0 1 0 1
run 256 1 1 2 2 0 1 0 1
run 256 1 1 2 2 0 1 0 0
run 512 1 1 2 2 0 1 0 1
run 64 0 1 2 2 0 1 0 1
date +%T
left 30 "floor" && timeout 30 /tmp/bench_cuda_floor f16 100 | head -9
left 90 "ferry" && {
  $F gen-model --preset llama-3.2-1b --type f16 -o $H > /dev/null 2>&1
  date +%T
  echo "ferry 1B F16 tg128: $(bt $H --device CUDA0)"
}
run 64 1 1 2 2 0 1 0 1
run 64 1 1 2 2 0 1 0 0
run 64 1 1 3 1 0 1 0 1
date +%T

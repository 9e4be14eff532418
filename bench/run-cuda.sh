#!/usr/bin/env bash
# Builds ferry on a GPU machine and runs the CUDA checks and benchmarks in one go (the device
# time is scarce: one command does everything). Logs go to $OUT (default ./cuda-out).
#
#   FIXTURES=path/to/fixtures   the ../shared/fixtures tree (tiny-llama), copied next to the source
#   GTEST_SRC=path/to/googletest  GoogleTest sources, built first when the machine has no GTest
#   STEPS="build ops tests bench serve"  which parts to run (default: those five); also
#         "tg" (tg128 only, no variants), "repeat" (the q8_0/q4_0 oracle cases REPEAT times under
#         each decode switch: a moving result is a race), "positions" (per-position flips against the oracle,
#         CPU and CUDA0), "profile" (FERRY_CUDA_PROFILE), "ncu" (per-kernel times under ncu),
#         "servestep" (bench/serve-step.sh: 1B Q4_0 tg128 local / unix / tcp, step batching on
#         and off, SERVE_REPS rounds, served test-ops over unix and tcp first), "floor"
#         (bench/bench_cuda_floor.cu: 82 kernels that only stream the decode step's bytes)
#         "host" (1B Q4_0 tg128 with FERRY_CUDA_GRAPH_STATS and FERRY_SESSION_PROFILE, KV pad
#         32 and 256: the host's share of a step)
#   TARGETS="ferry test_cuda test_ops"  what the build step builds
#   CUDA_FLAGS="-DFERRY_CUDA_TRACE"  extra nvcc flags (the trace build: bench/tools/trace-timeline.py)
#   PREBUILT=DIR  ferry and test_cuda from DIR (bench/build-for-device.sh) instead of build/cuda;
#         leave "build" out of STEPS
#
# Results are recorded by hand in bench/results/cuda.md with the date and the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/cuda-out}"
mkdir -p "$OUT"
STEPS="${STEPS:-build ops tests bench serve}"
JOBS="$(nproc)"
B=build/cuda
has() { [[ " $STEPS " == *" $1 "* ]]; }
log() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
if [ -n "${FIXTURES:-}" ] && [ ! -d ../shared/fixtures ]; then
  mkdir -p ../shared && cp -r "$FIXTURES" ../shared/fixtures
fi

if has build; then
  log build
  prefix=()
  if [ -n "${GTEST_SRC:-}" ] && [ -d /tmp/gtest/lib ]; then
    prefix=(-DCMAKE_PREFIX_PATH=/tmp/gtest)  # built by an earlier run on this machine
  elif [ -n "${GTEST_SRC:-}" ]; then
    cmake -S "$GTEST_SRC" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest >/tmp/gtest.log 2>&1 &&
      cmake --build /tmp/gtest-build -j "$JOBS" >>/tmp/gtest.log 2>&1 &&
      cmake --install /tmp/gtest-build >>/tmp/gtest.log 2>&1 || { log "gtest build failed"; }
    prefix=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
  fi
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
    -DFERRY_CUDA=ON -DFERRY_BENCH=OFF -DCMAKE_CUDA_FLAGS="${CUDA_FLAGS:-}" "${prefix[@]}" >"$OUT/build.log" 2>&1 &&
    cmake --build "$B" -j "$JOBS" --target ${TARGETS:-ferry test_cuda test_ops} >>"$OUT/build.log" 2>&1 ||
    { log "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  log "built"
fi
F="$B/bin/ferry"
T="$B/tests/test_cuda"
if [ -n "${PREBUILT:-}" ]; then
  F="$PREBUILT/ferry"
  T="$PREBUILT/test_cuda"
fi
"$F" devices | tee -a "$OUT/summary.txt"

if has ops; then
  log "test-ops CUDA0"
  "$F" test-ops --backend CUDA0 >"$OUT/test-ops.txt" 2>&1
  grep -E "FAIL|passed|skipped" "$OUT/test-ops.txt" | head -40 | tee -a "$OUT/summary.txt"
fi

if has tests; then
  log "test_cuda"
  "$T" >"$OUT/test_cuda.txt" 2>&1
  grep -E "^\[ cuda|FAILED|PASSED|Failure|error|Expected|Which is|actual|run " "$OUT/test_cuda.txt" | head -60 | tee -a "$OUT/summary.txt"
fi

if has repeat; then
  # The q8_0 and q4_0 oracle cases again and again, under each decode switch: a result that
  # moves between runs of one binary is a race (REPEAT runs of each).
  for v in "FERRY_CUDA_MV_Q8=1 FERRY_CUDA_PDL=1" "FERRY_CUDA_MV_Q8=1 FERRY_CUDA_PDL=0" \
           "FERRY_CUDA_MV_Q8=0 FERRY_CUDA_PDL=1" "FERRY_CUDA_MV_Q8=0 FERRY_CUDA_PDL=0" \
           "FERRY_CUDA_FUSION=0"; do
    log "oracle q8_0/q4_0 x${REPEAT:-10} with $v"
    for i in $(seq "${REPEAT:-10}"); do
      env $v "$T" --gtest_filter='Encodings/CudaOracle.*q8_0:Encodings/CudaOracle.*q4_0' 2>&1 |
        grep -E "kv f16|FAILED  \]" | grep -v "listed below"
    done | sort | uniq -c | tee -a "$OUT/summary.txt"
  done
fi

mem_watch() {  # samples used GPU memory (MiB) every 100 ms into $1 until killed
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$1" 2>/dev/null
}
peak() { sort -n "$1" | tail -1; }

if has bench; then
  log "gen-model"
  "$F" gen-model --preset llama-3.2-1b --type q4_0 -o /tmp/llama-1b-q4_0.gguf >/dev/null 2>&1
  "$F" gen-model --preset llama-3.2-1b --type f16 -o /tmp/llama-1b-f16.gguf >/dev/null 2>&1
  ls -la /tmp/*.gguf | tee -a "$OUT/summary.txt"
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  echo "GPU memory used before the benchmarks: $base MiB" | tee -a "$OUT/summary.txt"
  for m in /tmp/llama-1b-q4_0.gguf /tmp/llama-1b-f16.gguf ../shared/fixtures/tiny-llama/tiny-llama-q8_0.gguf; do
    log "bench $m"
    mem_watch "$OUT/mem.tmp" & mw=$!
    "$F" bench -m "$m" --device CUDA0 -p 512 -n 128 -r "${REPS:-5}" 2>&1 | tee -a "$OUT/summary.txt"
    kill $mw 2>/dev/null; wait $mw 2>/dev/null
    echo "peak GPU memory used: $(peak "$OUT/mem.tmp") MiB" | tee -a "$OUT/summary.txt"
  done
  rm -f "$OUT/mem.tmp"
  # VARIANTS: ';'-separated environment settings, each benchmarked (tg128) against the default.
  IFS=';' read -r -a variants <<<"${VARIANTS:-FERRY_CUDA_GRAPH=0;FERRY_CUDA_FUSION=0;FERRY_CUDA_MV_OCC=0;FERRY_CUDA_PDL=0;FERRY_CUDA_MV_Q8=0;FERRY_CUDA_MV_Q8=0 FERRY_CUDA_PDL=0}"
  for v in "${variants[@]}"; do
    for m in /tmp/llama-1b-q4_0.gguf /tmp/llama-1b-f16.gguf; do
      log "bench $m tg128 with $v"
      env $v "$F" bench -m "$m" --device CUDA0 -p 0 -n 128 -r 3 2>&1 | grep tg128 | tee -a "$OUT/summary.txt"
    done
  done
fi

gen_models() {
  for t in q4_0 f16; do
    [ -f /tmp/llama-1b-$t.gguf ] ||
      "$F" gen-model --preset llama-3.2-1b --type $t -o /tmp/llama-1b-$t.gguf >/dev/null 2>&1
  done
}

if has positions; then
  # The q5_k_m file with every block-format tensor dequantized to F32: the quantized model
  # computed with fp32 activations (no activation quantization anywhere).
  g++ -std=c++20 -O2 -Iinclude -Isrc bench/tools/dequant-gguf.cpp -Wl,--start-group \
    "$B"/libferry_model.a "$B"/libferry_backend.a "$B"/libferry_core.a -Wl,--end-group \
    -lpthread -o /tmp/dequant-gguf >"$OUT/dequant.log" 2>&1 || log "dequant-gguf: build failed"
  /tmp/dequant-gguf ../shared/fixtures/tiny-llama/tiny-llama-q5_k_m.gguf /tmp/q5_k_m-deq.gguf \
    >>"$OUT/dequant.log" 2>&1
  for dev in CPU CUDA0; do
    log "oracle positions q5_k_m dequantized to f32 $dev"
    python3 bench/oracle-positions.py "$F" /tmp/q5_k_m-deq.gguf --device $dev 2>&1 |
      tee -a "$OUT/summary.txt"
  done
  for enc in q5_k_m q6_k q4_k_m; do
    for dev in CPU CUDA0; do
      log "oracle positions $enc $dev"
      python3 bench/oracle-positions.py "$F" ../shared/fixtures/tiny-llama/tiny-llama-$enc.gguf \
        --device $dev 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
fi

if has tg; then
  # TG_VARIANTS: ';'-separated environment settings, each run after the default (interleaved
  # per model, so that A and B are side by side).
  gen_models
  IFS=';' read -r -a tgv <<<"${TG_VARIANTS:-}"
  for m in /tmp/llama-1b-q4_0.gguf /tmp/llama-1b-f16.gguf ../shared/fixtures/tiny-llama/tiny-llama-q8_0.gguf; do
    for v in "FERRY_CUDA_DEFAULTS=1" "${tgv[@]}"; do
      log "bench tg $m with $v"
      env $v "$F" bench -m "$m" --device CUDA0 -p 0 -n 128 -r 5 2>&1 | grep tg128 | tee -a "$OUT/summary.txt"
    done
  done
fi

if has ncu; then
  gen_models
  for m in ${NCU_MODELS:-/tmp/llama-1b-q4_0.gguf /tmp/llama-1b-f16.gguf ../shared/fixtures/tiny-llama/tiny-llama-q8_0.gguf}; do
    log "ncu decode kernels $m"
    b=$(basename "$m" .gguf)
    timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
      --csv --print-units base --launch-skip 600 --launch-count 300 "$F" bench -m "$m" --device CUDA0 -p 0 -n 8 -r 1 \
      >"$OUT/ncu-$b.csv" 2>"$OUT/ncu-$b.err"
    python3 bench/ncu-summary.py "$OUT/ncu-$b.csv" 2>&1 | tee -a "$OUT/summary.txt"
  done
fi

if has floor; then
  log "floor: 82 streaming kernels with the 1B decode step's bytes"
  nvcc -std=c++17 -arch=sm_90 -O3 bench/bench_cuda_floor.cu -o /tmp/bench_cuda_floor \
    >"$OUT/floor-build.log" 2>&1 || log "bench_cuda_floor: build failed"
  for m in q4_0 f16; do
    /tmp/bench_cuda_floor $m 100 2>&1 | tee -a "$OUT/summary.txt"
  done
fi

if has host; then
  # The host's share of a decode step: how each graph ran (FERRY_CUDA_GRAPH_STATS) and the
  # session's per-step host times (FERRY_SESSION_PROFILE), with the KV padded to 32 (one
  # capture per 32 tokens) and to 256.
  gen_models
  for pad in 32 256; do
    log "host times, 1B q4_0 tg128, --kv-pad $pad"
    FERRY_CUDA_GRAPH_STATS=1 FERRY_SESSION_PROFILE=1 "$F" bench -m /tmp/llama-1b-q4_0.gguf \
      --device CUDA0 -p 0 -n 128 -r 5 --kv-pad $pad 2>&1 | grep -E "tg128|stats|profile" |
      tee -a "$OUT/summary.txt"
  done
fi

if has profile; then
  gen_models
  for m in ${PROFILE_MODELS:-/tmp/llama-1b-q4_0.gguf}; do
    log "kernel profile (FERRY_CUDA_PROFILE=1) tg32 $m"
    FERRY_CUDA_PROFILE=1 "$F" bench -m "$m" --device CUDA0 -p 0 -n 32 -r 1 2>&1 | head -40 | tee -a "$OUT/summary.txt"
  done
  if [ "${PROFILE_PP:-1}" != 0 ]; then
    log "kernel profile pp512 q4_0"
    FERRY_CUDA_PROFILE=1 "$F" bench -m /tmp/llama-1b-q4_0.gguf --device CUDA0 -p 512 -n 0 -r 1 2>&1 | head -30 | tee -a "$OUT/summary.txt"
  fi
fi

if has servestep; then
  # Served decode against local, batching on and off, unix and tcp side by side
  # (bench/serve-step.sh; SERVE_REPS rounds of tg128 -r 3), after served test-ops on both.
  gen_models
  log "serve-step 1B q4_0"
  DEVICE=CUDA0 CHECK=1 PROFILE=1 bash bench/serve-step.sh "$F" /tmp/llama-1b-q4_0.gguf \
    "${SERVE_REPS:-5}" 128 2>&1 | tee -a "$OUT/summary.txt"
fi

if has serve; then
  log "serve over unix"
  "$F" serve --listen unix:/tmp/ferry-cuda.sock --device CUDA0 >"$OUT/serve.log" 2>&1 & sp=$!
  sleep 2
  "$F" devices --remote unix:/tmp/ferry-cuda.sock 2>&1 | tee -a "$OUT/summary.txt"
  "$F" bench -m /tmp/llama-1b-q4_0.gguf --remote unix:/tmp/ferry-cuda.sock -p 512 -n 128 -r 3 2>&1 | tee -a "$OUT/summary.txt"
  if [ "${SERVE_OPS:-1}" != 0 ]; then
    "$F" test-ops --remote unix:/tmp/ferry-cuda.sock --backend unix:/tmp/ferry-cuda.sock/CUDA0 >"$OUT/test-ops-remote.txt" 2>&1
    tail -2 "$OUT/test-ops-remote.txt" | tee -a "$OUT/summary.txt"
  fi
  kill $sp 2>/dev/null
fi
log done

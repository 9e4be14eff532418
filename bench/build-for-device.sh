#!/usr/bin/env bash
# Builds ferry and test_cuda on this machine (nvcc, no GPU needed) for the GPU machine, so that a
# device run spends its time running instead of building (~4 minutes of a 30-minute budget):
# no -march=native (the GPU machine's CPU may differ), no OpenVINO (its libraries live in this
# machine's venv), libstdc++ and libgcc linked in; the stripped binaries go to OUT_DIR.
#
#   bash bench/build-for-device.sh [OUT_DIR]      (default .devbin, ignored by git)
#   then, on the device:  PREBUILT=.devbin STEPS="ops tg ..." bash bench/run-cuda.sh
#   (the run tool's carry: [".devbin"]; ~28 MB)
#   BUILD_DIR=DIR builds elsewhere (e.g. CUDA_FLAGS=-DFERRY_CUDA_TRACE BUILD_DIR=build/devtrace).
#   CUDA_FLAGS is set on every call (unset: none), so a build dir never keeps an earlier call's.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.devbin}"
bd="${BUILD_DIR:-build/devpkg}"
cmake -S . -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
  -DFERRY_CUDA=ON -DFERRY_OPENVINO=OFF -DFERRY_NATIVE=OFF -DFERRY_BENCH=OFF \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" -DCMAKE_CUDA_FLAGS="${CUDA_FLAGS:-}" >/dev/null
cmake --build "$bd" -j "$(nproc)" --target ferry test_cuda
mkdir -p "$out"
cp "$bd/bin/ferry" "$bd/tests/test_cuda" "$out/"
strip "$out/ferry" "$out/test_cuda"
ls -la "$out"

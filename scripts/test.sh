#!/usr/bin/env bash
# Builds ferry and runs every test: the release build's full ctest suite, then the tests that
# read untrusted bytes (GGUF files, remote requests) again under clang ASan + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh release
ctest --preset release -j "$(nproc)" --timeout 900

# Decoders of outside bytes, under the sanitizers.
bash scripts/setup.sh asan
ctest --preset asan -j "$(nproc)" --timeout 900 -R 'Gguf|Corrupt|Hostile|Wire'

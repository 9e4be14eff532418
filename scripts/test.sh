#!/usr/bin/env bash
# Builds ferry and runs every test: the tests that read untrusted bytes (GGUF files, JSON,
# remote requests) under clang ASan + UBSan, then the release build's full ctest suite (its
# summary is the last thing printed).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, printed as it ends (where CI's minutes go).
t0=$SECONDS
phase() { echo "test: $1 took $((SECONDS - t0)) s"; t0=$SECONDS; }

bash scripts/setup.sh release
phase "setup + release build"
# QEMU, busybox-static, cpio and the cloud kernel (extracted into build/vm) for the VM guest
# test; without them that test reports itself skipped.
bash scripts/setup-vm.sh || echo "test: setup-vm failed; the VM guest test will be skipped"
phase "VM guest setup"

# The installed binary carries the demo model: `ferry run` works outside the build tree.
prefix="$(mktemp -d)"
cmake --install build/release --prefix "$prefix" >/dev/null
(cd / && "$prefix/bin/ferry" run -n 8 >/dev/null)
rm -rf "$prefix"
echo "install check: ferry run from the installed binary works"
phase "install check"

# Decoders of outside bytes under the sanitizers: the remote tests spawn the sanitized
# `ferry serve`.
bash scripts/setup.sh asan ferry test_gguf test_json test_remote test_remote_hostile test_remote_limits
phase "ASan + UBSan build"
# Every transport's instance of the hostile suite, ivshmem windows included (their HELLO and
# per-frame deadlines and the compute abort: IvshmemDeadlines.*).
ctest --preset asan -j "$(nproc)" --timeout 900 \
  -R '^(Gguf|Json|Remote|Hostile|Transports|TinyLlama|IvshmemDeadlines)'
phase "ASan + UBSan tests"

# The release suite's own summary (counts) stays the last thing printed.
ctest --preset release -j "$(nproc)" --timeout 900

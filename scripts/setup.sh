#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds ferry (release preset).
# Installs, with apt-get, only the packages that are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ clang libclang-rt-14-dev libgtest-dev ccache python3 python3-venv xz-utils)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The OpenVINO runtime (for the OpenVINO backend) from PyPI, into the project-local venv .venv,
# never system-wide. Without it (no network, no wheel for this machine) the build goes on
# without the backend and CMake says so.
openvino_version=2026.4.1
if [ "${FERRY_OPENVINO:-AUTO}" != OFF ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || echo "setup: could not create .venv; building without OpenVINO"
  fi
  if [ -x .venv/bin/python ] &&
    ! .venv/bin/python -c "import openvino, sys; sys.exit(openvino.__version__.split('-')[0] != '$openvino_version')" 2>/dev/null; then
    echo "setup: installing openvino==$openvino_version into .venv"
    .venv/bin/pip install -q --disable-pip-version-check "openvino==$openvino_version" ||
      echo "setup: could not install openvino; building without the OpenVINO backend"
  fi
fi

# Usage: setup.sh [PRESET [TARGET...]] (default: the release preset, every target).
preset="${1:-release}"
shift || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"

#!/usr/bin/env bash
# What the VM guest test (tests/vm/guest-test.sh) needs: QEMU, a static busybox and cpio from
# Debian packages, and the Debian cloud kernel, extracted from its package into build/vm/
# (downloaded with apt-get download, never installed). Idempotent; prints what it did.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(qemu-system-x86 busybox-static cpio)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if ((${#missing[@]})); then
  echo "setup-vm: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

out=build/vm
mkdir -p "$out"
if [ ! -s "$out/vmlinuz" ]; then
  # linux-image-cloud-amd64 is a metapackage; the kernel is in the package it depends on.
  pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$pkg" ]; then
    $SUDO apt-get update -qq
    pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  [ -n "$pkg" ] || { echo "setup-vm: cannot find the cloud kernel package" >&2; exit 1; }
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq "$pkg")
  dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
  cp "$tmp"/root/boot/vmlinuz-* "$out/vmlinuz"
  echo "$pkg" > "$out/vmlinuz.package"
  rm -rf "$tmp"
  echo "setup-vm: kernel from $pkg in $out/vmlinuz"
fi

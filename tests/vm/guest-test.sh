#!/usr/bin/env bash
# A real guest: boots Linux under QEMU (TCG: no KVM needed) with an ivshmem window served by
# `ferry serve --listen ivshmem:...` on the host. Inside the guest, a statically linked ferry
# runs `ferry logits --remote ivshmem:auto` and `ferry run --temp 0`; their results must be
# the host's local ones, bit for bit (logits compared by SHA-256) and token for token. Then the
# guest starts an endless generation and QEMU is killed (SIGKILL) in the middle of it: the
# host must free that session's memory within the I/O timeout, as a fresh session on a second
# window sees it (`ferry devices --stats`: the server's bytes and sessions).
#
# Usage: guest-test.sh FERRY FERRY_STATIC MODEL VMDIR
#   VMDIR holds vmlinuz (scripts/setup-vm.sh puts it in build/vm). Exits 77 (skipped) when
#   QEMU, busybox, cpio or the kernel are missing.
set -euo pipefail
ferry=$1
ferry_static=$2
model=$3
vmdir=$4

skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not installed (scripts/setup-vm.sh)"
command -v cpio >/dev/null || skip "cpio not installed (scripts/setup-vm.sh)"
# busybox-static installs /bin/busybox (the dynamic busybox package would too, but without
# its libraries the guest could not run it: setup-vm.sh installs the static one).
busybox=/bin/busybox
[ -x "$busybox" ] || skip "busybox-static not installed (scripts/setup-vm.sh)"
[ -s "$vmdir/vmlinuz" ] || skip "no kernel in $vmdir/vmlinuz (scripts/setup-vm.sh)"

work=$(mktemp -d /tmp/ferry-vm-XXXXXX)
srv=""
cleanup() {
  if [ -n "$srv" ]; then
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
  fi
  [ -n "${FERRY_VM_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

tokens=1,45,99,300,7,12,512,3
prompt="The license"
# The host's own results.
"$ferry" logits -m "$model" --tokens $tokens --out "$work/local.logits" 2>/dev/null
want_sha=$(sha256sum "$work/local.logits" | cut -d' ' -f1)
"$ferry" run -m "$model" -p "$prompt" -n 24 --temp 0 2>/dev/null >"$work/local.txt"

# The initramfs: busybox, the static ferry, the model, an init that runs both commands.
root=$work/root
mkdir -p "$root"/{bin,proc,sys,dev,tmp}
cp "$busybox" "$root/bin/busybox"
for l in sh mount poweroff sha256sum cat echo; do ln -s busybox "$root/bin/$l"; done
# Stripped, and the archive left uncompressed: under TCG every byte the guest kernel
# decompresses costs emulated instructions (boot time).
strip -o "$root/bin/ferry" "$ferry_static"
cp "$model" "$root/model.gguf"
cat >"$root/init" <<EOF
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "GUEST-UP \$(cat /proc/uptime)"
if /bin/ferry logits -m /model.gguf --tokens $tokens --out /tmp/guest.logits --remote ivshmem:auto 2>/tmp/logits.err; then
  echo "GUEST-LOGITS \$(sha256sum /tmp/guest.logits)"
else
  echo "GUEST-LOGITS-FAILED"; cat /tmp/logits.err
fi
echo "GUEST-RUN-BEGIN"
/bin/ferry run -m /model.gguf -p "$prompt" -n 24 --temp 0 --remote ivshmem:auto 2>/tmp/run.err
echo "GUEST-RUN-END rc=\$?"
cat /tmp/run.err
echo "GUEST-DONE \$(cat /proc/uptime)"
# Generation until QEMU is killed (the host waits for tokens after this line).
echo "GUEST-GEN-BEGIN"
/bin/ferry run -m /model.gguf -p "$prompt" -n 100000 -c 2048 --temp 1 --seed 7 --remote ivshmem:auto 2>/dev/null
echo "GUEST-GEN-END rc=\$?"
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet >"$work/initrd.cpio")

# The host side: the guest's window and a second one for the host-side probe.
win=$work/window
io_timeout=3
"$ferry" serve --listen "ivshmem:$win,size=16M" --listen "ivshmem:$work/probe,size=1M" \
  --io-timeout $io_timeout -v >"$work/serve.out" 2>"$work/serve.err" &
srv=$!
for _ in $(seq 100); do [ "$(grep -c "listening on" "$work/serve.out")" = 2 ] && break; sleep 0.05; done
[ "$(grep -c "listening on" "$work/serve.out")" = 2 ] || { cat "$work/serve.err"; echo "FAIL: server did not start"; exit 1; }

accel=tcg
[ -w /dev/kvm ] && [ "${FERRY_VM_KVM:-0}" = 1 ] && accel=kvm
# The server's totals over all sessions, seen by a fresh session on the probe window.
probe() {
  "$ferry" devices --remote "ivshmem:$work/probe" --stats 2>/dev/null |
    sed -n 's/.*server sessions \([0-9]*\), bytes \([0-9]*\).*/\1 \2/p'
}
t0=$(date +%s.%N)
qemu-system-x86_64 -accel $accel -cpu max -smp 2 -m 512 -nographic -no-reboot -nic none \
  -kernel "$vmdir/vmlinuz" -initrd "$work/initrd.cpio" \
  -append "console=ttyS0 quiet panic=-1 tsc=reliable" \
  -object "memory-backend-file,id=w,share=on,mem-path=$win,size=16M" \
  -device ivshmem-plain,memdev=w >"$work/console.txt" 2>&1 &
qemu=$!
# Until the endless generation has streamed some text (or the guest ended, or 150 s).
generating=0
for _ in $(seq 1500); do
  kill -0 $qemu 2>/dev/null || break
  if [ "$(sed -n '/GUEST-GEN-BEGIN/,$p' "$work/console.txt" | wc -c)" -gt 120 ]; then
    generating=1
    break
  fi
  sleep 0.1
done
t1=$(date +%s.%N)
kill_result="FAIL: the guest never reached its generation"
if [ $generating = 1 ]; then
  before=$(probe)
  kill -9 $qemu
  wait $qemu 2>/dev/null || true
  tk=$(date +%s.%N)
  freed=""
  for _ in $(seq 100); do
    if [ "$(probe)" = "1 0" ]; then
      freed=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $tk}")
      break
    fi
    sleep 0.1
  done
  if [ -z "$freed" ]; then
    kill_result="FAIL: QEMU killed mid-generation; the server still holds (sessions, bytes) '$(probe)' after 10 s (before the kill: '$before')"
  elif ! awk "BEGIN{exit !($freed <= $io_timeout + 2)}"; then
    kill_result="FAIL: QEMU killed mid-generation; its session was freed only after $freed s (--io-timeout $io_timeout)"
  else
    kill_result="ok: QEMU killed mid-generation (server sessions, bytes before: $before); the session and all its bytes freed on the host $freed s later (--io-timeout $io_timeout)"
  fi
else
  kill $qemu 2>/dev/null || true
  wait $qemu 2>/dev/null || true
fi
tr -d '\r' <"$work/console.txt" >"$work/console"

fail=0
up=$(grep -o -m1 'GUEST-UP [0-9.]*' "$work/console" | awk '{print $2}' || true)
done_at=$(grep -m1 '^GUEST-DONE' "$work/console" | awk '{print $2}' || true)
got_sha=$(grep -m1 '^GUEST-LOGITS ' "$work/console" | awk '{print $2}' || true)
sed -n '/^GUEST-RUN-BEGIN$/,/^GUEST-RUN-END/p' "$work/console" | sed '1d;$d' >"$work/guest.txt" || true
printf 'boot to init: %s s (guest clock); checks done at %s s; qemu wall to the kill %.1f s (accel %s)\n' \
  "${up:-?}" "${done_at:-?}" "$(awk "BEGIN{print $t1 - $t0}")" "$accel"
if [ -z "$up" ]; then
  echo "FAIL: the guest never reached init"
  fail=1
elif ! awk "BEGIN{exit !($up < 10)}"; then
  echo "FAIL: boot took $up s (limit 10 s)"
  fail=1
fi
if [ "$got_sha" != "$want_sha" ]; then
  echo "FAIL: guest logits sha256 '${got_sha:-none}' != host local '$want_sha'"
  fail=1
else
  echo "ok: guest logits through ivshmem:auto bit-identical to the host's local run ($want_sha)"
fi
# The guest's console output may wrap; compare the text without line structure.
if [ "$(tr -d '\n' <"$work/guest.txt")" != "$(tr -d '\n' <"$work/local.txt")" ]; then
  echo "FAIL: guest text differs"
  echo "--- host:"; cat "$work/local.txt"
  echo "--- guest:"; cat "$work/guest.txt"
  fail=1
else
  echo "ok: guest 'ferry run --temp 0' text identical: $(tr -d '\n' <"$work/local.txt")"
fi
grep -m1 'generated' "$work/console" || true
echo "$kill_result"
case "$kill_result" in ok:*) ;; *) fail=1 ;; esac
grep -m1 'closed: the client stopped' "$work/serve.err" || true
if [ $fail != 0 ]; then
  echo "--- console:"
  tail -40 "$work/console"
  echo "--- serve.err:"
  tail -5 "$work/serve.err"
fi
exit $fail

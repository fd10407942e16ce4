#!/usr/bin/env bash
# aarch64 user-mode emulation for the plugin's tests: Debian's qemu-user-static (qemu-aarch64-static)
# and the aarch64 glibc (libc6-arm64-cross, /usr/aarch64-linux-gnu) that dynamically linked test
# binaries load.  Installed when missing (root + apt-get), else explained; every apt-get step is
# bounded by a timeout.  Prints the qemu command.
set -euo pipefail
sysroot=/usr/aarch64-linux-gnu
find_qemu() { command -v qemu-aarch64-static || command -v qemu-aarch64; }
if q=$(find_qemu) && [ -e "$sysroot/lib/ld-linux-aarch64.so.1" ]; then echo "$q"; exit 0; fi
pkgs="qemu-user-static libc6-arm64-cross"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "cross: aarch64 tests need qemu user emulation (Debian: apt-get install $pkgs)" >&2
  exit 1
fi
log=${TMPDIR:-/tmp}/dynamiccl-apt-qemu.log
echo "cross: installing $pkgs from Debian (log: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
apt_() { timeout 900 apt-get -o DPkg::Lock::Timeout=120 -y -q --no-install-recommends "$@" >>"$log" 2>&1; }
# shellcheck disable=SC2086
apt_ install $pkgs || { apt_ update && apt_ install $pkgs; } || {
  echo "cross: apt-get could not install $pkgs (see $log)" >&2
  exit 1
}
q=$(find_qemu) || { echo "cross: qemu-aarch64 missing after the install (see $log)" >&2; exit 1; }
echo "$q"

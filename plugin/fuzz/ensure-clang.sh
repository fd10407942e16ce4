#!/usr/bin/env bash
# libFuzzer comes with Debian's clang; install it when missing (root + apt-get), else explain.
# Every apt-get step is bounded by a timeout, so a stuck mirror or dpkg lock fails the build
# with a message instead of hanging it.
set -euo pipefail
have_fuzzer() {
  local cc
  cc=$(command -v clang || command -v clang-14) || return 1
  echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){(void)d;(void)n;return 0;}' \
    | "$cc" -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null
}
have_fuzzer && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "fuzz: clang with libFuzzer is required (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
log=${TMPDIR:-/tmp}/dynamiccl-apt-clang.log
echo "fuzz: installing clang + libFuzzer from Debian (clang-14, libclang-rt-14-dev; log: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
apt_() { timeout 900 apt-get -o DPkg::Lock::Timeout=120 -y -q "$@" >>"$log" 2>&1; }
apt_ install clang-14 libclang-rt-14-dev || { apt_ update && apt_ install clang-14 libclang-rt-14-dev; } || {
  echo "fuzz: apt-get could not install clang-14 (see $log)" >&2
  exit 1
}
have_fuzzer || { echo "fuzz: clang-14 installed but cannot link -fsanitize=fuzzer (see $log)" >&2; exit 1; }

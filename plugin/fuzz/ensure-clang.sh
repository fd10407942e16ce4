#!/usr/bin/env bash
# libFuzzer comes with Debian's clang; install it when missing (root + apt-get), else explain.
set -euo pipefail
if command -v clang >/dev/null 2>&1 || command -v clang-14 >/dev/null 2>&1; then
  cc=$(command -v clang || command -v clang-14)
  if echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){(void)d;(void)n;return 0;}' \
      | "$cc" -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then exit 0; fi
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "fuzz: installing clang + libFuzzer from Debian (clang-14, libclang-rt-14-dev)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q clang-14 libclang-rt-14-dev >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q clang-14 libclang-rt-14-dev >/dev/null; }
  exit 0
fi
echo "fuzz: clang with libFuzzer is required (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
exit 1

#!/usr/bin/env bash
# Print the path of a zig binary (zig's `cc` cross-compiles C against any glibc version, for any
# architecture), installing the pinned `ziglang` wheel from PyPI into a private virtualenv in the
# cache when missing (a virtualenv: Debian's own python3 refuses pip installs outside one).
#   $DYNAMICCL_CACHE/zig/ziglang-$ZIG_VERSION/        (DYNAMICCL_CACHE: ~/.cache/dynamiccl/v1)
# A stamp (holding the binary's path) is written only after the install succeeded.
set -euo pipefail
ZIG_VERSION=${ZIG_VERSION:-0.14.1}
cache=${DYNAMICCL_CACHE:-$HOME/.cache/dynamiccl/v1}
dir=$cache/zig/ziglang-$ZIG_VERSION
mkdir -p "$cache/zig"
exec 9>"$cache/zig/.lock" # serialise concurrent builds sharing the cache
flock 9
if [ ! -f "$dir/.stamp" ] || [ ! -x "$(cat "$dir/.stamp")" ]; then
  py=$(command -v python3.11 || command -v python3) || { echo "cross: python3 is needed to install zig" >&2; exit 1; }
  mkdir -p "$cache/zig" "$cache/pip"
  log=$cache/zig/install.log
  echo "cross: installing zig $ZIG_VERSION (PyPI ziglang) into $dir" >&2
  rm -rf "$dir"
  { "$py" -m venv "$dir" && PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1 \
      timeout 900 "$dir/bin/pip" install -q "ziglang==$ZIG_VERSION"; } >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  zig=$("$dir/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
  "$zig" version >/dev/null
  echo "$zig" >"$dir/.stamp"
fi
cat "$dir/.stamp"

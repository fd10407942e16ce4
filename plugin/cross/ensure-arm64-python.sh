#!/usr/bin/env bash
# Print a command that runs an aarch64 CPython 3.11 under qemu user emulation, for running the
# ctypes plugin tests against the aarch64 .so (ctypes loads only a .so of its own architecture).
#   $DYNAMICCL_CACHE/arm64-python/<key>/root   Debian bookworm's python3.11 for arm64, unpacked
#                                              (mmdebstrap --variant=extract: no maintainer
#                                              scripts, so no binfmt registration is needed)
#   $DYNAMICCL_CACHE/arm64-python/<key>/site   the test dependencies as aarch64 wheels from PyPI,
#                                              at the versions the host's .venv has
# The key hashes those versions; a stamp is written only after both steps succeeded.
# usage: ensure-arm64-python.sh QEMU HOST_PYTHON REPO_ROOT
set -euo pipefail
qemu=$1 host_py=$2 root=$3
cache=${DYNAMICCL_CACHE:-$HOME/.cache/dynamiccl/v1}
pkgs="pydantic pydantic-core annotated-types typing-extensions typing-inspection atomics cffi pytest pytest-timeout hypothesis pyyaml"
pins=$("$host_py" - $pkgs <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1:]:
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
PY
)
key=$(echo "bookworm python3.11 $pins" | sha256sum | cut -c1-16)
dir=$cache/arm64-python/$key
mkdir -p "$cache/arm64-python"
exec 9>"$cache/arm64-python/.lock"
flock 9
if [ ! -f "$dir/.stamp" ]; then
  log=$cache/arm64-python/install.log
  echo "cross: unpacking an arm64 python3.11 and its test wheels into $dir (log: $log)" >&2
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "cross: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -o DPkg::Lock::Timeout=120 -y -q \
      --no-install-recommends install mmdebstrap >>"$log" 2>&1 \
      || { echo "cross: apt-get could not install mmdebstrap (see $log)" >&2; exit 1; }
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  timeout 900 mmdebstrap --arch=arm64 --variant=extract \
    --include=python3.11-minimal,libpython3.11-stdlib bookworm "$dir/root" </dev/null >>"$log" 2>&1 \
    || { echo "cross: mmdebstrap of the arm64 python failed (see $log)" >&2; exit 1; }
  # shellcheck disable=SC2086
  PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 900 "$host_py" -m pip install -q \
    --target "$dir/site" --platform manylinux2014_aarch64 --only-binary=:all: \
    --python-version 3.11 --implementation cp $pins >>"$log" 2>&1 \
    || { echo "cross: aarch64 wheels could not be installed (see $log)" >&2; exit 1; }
  "$qemu" -L "$dir/root" "$dir/root/usr/bin/python3.11" -c 'import platform; assert platform.machine() == "aarch64"' \
    || { echo "cross: the arm64 python does not start under $qemu" >&2; exit 1; }
  touch "$dir/.stamp"
fi
echo "env PYTHONPATH=$dir/site:$root $qemu -L $dir/root $dir/root/usr/bin/python3.11"

#!/usr/bin/env bash
# Set up the Python environment for this checkout, reusing a cached one.
#
#   $DYNAMICCL_CACHE/venv   shared, heavy dependencies (torch, kopf, ...), keyed
#                           by a hash of pyproject.toml's dependency lists;
#                           rebuilt only when they change.
#   ./.venv                 this checkout's own venv: sees the shared one through
#                           a .pth file and holds dynamiccl installed editable.
# A stamp is written only after a step succeeded, so an interrupted install is
# never mistaken for a complete one.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
here=${REPO_ROOT}
cache=${DYNAMICCL_CACHE}
py=${PYTHON:-python3.11}
deps=$cache/venv
log=$cache/logs/venv.log
mkdir -p "$cache/logs" "$cache/pip"
export PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1

# Serialise concurrent runs (several checkouts share the cached venv).
exec 9>"$cache/venv.lock"
flock 9
command -v "$py" >/dev/null 2>&1 || die "$py not found (need CPython 3.11 on PATH, or set PYTHON=...)"

reqs=$("$py" - "$here/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
extra = p["optional-dependencies"]
print("\n".join(p["dependencies"] + extra["train"] + extra["plots"] + extra["dev"]))
PY
)
want=$( { "$py" --version; echo "$reqs"; } | sha256sum | cut -c1-16)

if [ "$(cat "$deps/.stamp" 2>/dev/null)" != "$want" ]; then
  echo "hack/venv.sh: syncing cached dependencies in $deps (first run downloads torch, ~3 GB)"
  rm -f "$deps/.stamp"
  [ -x "$deps/bin/python" ] || "$py" -m venv "$deps" >>"$log" 2>&1 || die "could not create $deps; see $log"
  echo "$reqs" > "$cache/requirements.txt"
  "$deps/bin/pip" install -q -r "$cache/requirements.txt" >>"$log" 2>&1 \
    || die "dependency install failed (PyPI unreachable or a package missing); see $log"
  echo "$want" > "$deps/.stamp"
fi

site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
local_want=$(echo "$want $here $(sha256sum "$here/pyproject.toml")" | sha256sum | cut -c1-16)
if [ "$(cat "$here/.venv/.stamp" 2>/dev/null)" != "$local_want" ]; then
  rm -rf "$here/.venv"
  "$py" -m venv --without-pip "$here/.venv" >>"$log" 2>&1 || die "could not create $here/.venv; see $log"
  lsite=$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" > "$lsite/_dynamiccl_shared_deps.pth"
  "$here/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >>"$log" 2>&1 \
    || die "editable install of dynamiccl failed; see $log"
  echo "$local_want" > "$here/.venv/.stamp"
fi

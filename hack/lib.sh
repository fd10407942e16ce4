# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
# shellcheck disable=SC2034  # variables are used by the scripts that source this file
# Common settings for the hack/ scripts. Source it, don't run it.
#
# Exposes:
#   HACK_DIR, REPO_ROOT            absolute paths
#   DYNAMICCL_CACHE                cache root (default ~/.cache/dynamiccl/v1)
#   TOOLS_BIN_ROOT                 $DYNAMICCL_CACHE/bin
#   the *_VERSION variables of hack/versions.env
#   PROG, START, die, info         the scripts' messages (info: seconds since start)
#   tool_dir NAME                  cache dir of one binary (bin/<name>-<version>)
#   tool_bin NAME                  path of a built binary; fails if not built
#   go_env                         exports GOMODCACHE/GOCACHE/... for our builds

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${HACK_DIR}/.." && pwd)"
# Messages of every hack/ script: "hack/<script>: [<seconds since start>s] ...".
PROG="${PROG:-hack/${0##*/}}"
START="${START:-${SECONDS}}"
die() { echo "${PROG}: error: $*" >&2; exit 1; }
info() { echo "${PROG}: [$((SECONDS - START))s] $*" >&2; }
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

DYNAMICCL_CACHE="${DYNAMICCL_CACHE:-${HOME}/.cache/dynamiccl/v1}"
TOOLS_BIN_ROOT="${DYNAMICCL_CACHE}/bin"

# name -> version. Every binary the cluster scripts need.
tool_version() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) echo "${KUBERNETES_VERSION}" ;;
    etcd) echo "${ETCD_VERSION}" ;;
    kwok) echo "${KWOK_VERSION}" ;;
    helm) echo "${HELM_VERSION}" ;;
    training-operator) echo "${TRAINING_OPERATOR_VERSION}" ;;
    kubelet|kube-proxy) echo "${KUBERNETES_VERSION}" ;;
    coredns) echo "${COREDNS_VERSION}" ;;
    containerd|containerd-shim-runc-v2|ctr) echo "${CONTAINERD_VERSION}" ;;
    *) echo "hack/lib.sh: unknown tool '$1'" >&2; return 1 ;;
  esac
}

ALL_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm training-operator)
# Only the real node needs these (hack/real-node.sh builds them on demand).
NODE_TOOLS=(kubelet kube-proxy coredns containerd containerd-shim-runc-v2 ctr)

tool_dir() {
  local v
  v="$(tool_version "$1")" || return 1
  echo "${TOOLS_BIN_ROOT}/$1-${v}"
}

# Path of a complete (stamped) build of tool $1, or an error.
tool_bin() {
  local d
  d="$(tool_dir "$1")" || return 1
  if [[ -f "${d}/.complete" && -x "${d}/$1" ]]; then
    echo "${d}/$1"
  else
    echo "hack: error: $1 $(tool_version "$1") is not built; run hack/build-tools.sh" >&2
    return 1
  fi
}

# Go environment for building the tools: module and build caches live under
# the cache root so a warm run downloads and compiles nothing.
go_env() {
  export GOMODCACHE="${DYNAMICCL_CACHE}/go/mod"
  export GOCACHE="${DYNAMICCL_CACHE}/go/build"
  export GOPATH="${DYNAMICCL_CACHE}/go/path"
  export CGO_ENABLED=0
  export GOFLAGS="-mod=readonly"
  export GOWORK=off
  unset GOBIN GOOS GOARCH
}

# pidfile_exe PIDFILE: "PID NAME" of the live process whose pid PIDFILE holds (NAME: the
# basename of its executable); fails when the file is missing or malformed, or the pid
# is gone or a zombie (no exe link).
pidfile_exe() {
  local pid exe
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
  exe="$(readlink "/proc/${pid}/exe" 2>/dev/null)" || return 1
  echo "${pid} $(basename "${exe% (deleted)}")"
}

# pidfile_runs PIDFILE NAME: the pid in PIDFILE, if it runs NAME (so a recycled pid is
# never reported or killed).
pidfile_runs() {
  local r
  r="$(pidfile_exe "$1")" || return 1
  [[ "${r#* }" == "$2" ]] || return 1
  echo "${r%% *}"
}

# pid_on_its_way PIDFILE NAME: the pid in PIDFILE runs NAME, or is still on its way there
# through run_detached's exec chain (the background subshell, setsid, env); on a loaded
# machine that chain takes long enough for a liveness check to land in it, and it must
# not read as the daemon having exited. Fails once the pid is gone or a zombie (no exe).
pid_on_its_way() {
  local r
  r="$(pidfile_exe "$1")" || return 1
  case "${r#* }" in
    "$2" | bash | setsid | env) return 0 ;;
    *) return 1 ;;
  esac
}

# run_detached CMD...: CMD in its own session with no descriptor of ours but 0-2
# (redirect those at the call site; put the call in the background with &). An
# inherited lock (a script's flock, or the real tier's when `flock LOCK cmd` runs a
# script) would otherwise stay held for as long as the daemon runs.
run_detached() {
  local fd
  for fd in /proc/"${BASHPID}"/fd/*; do
    fd="${fd##*/}"
    if (( fd > 2 )); then eval "exec ${fd}>&-"; fi
  done
  exec setsid "$@"
}

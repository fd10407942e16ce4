#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build (or reuse from cache) every binary the local control plane needs:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (k8s.io/kubernetes)
#   etcd  kwok  helm  training-operator
#
# Each binary lands in ${DYNAMICCL_CACHE:-~/.cache/dynamiccl/v1}/bin/<name>-<version>/<name>
# with a .complete stamp. A directory without a stamp (or with a stamp from a
# different wrapper-module fingerprint) is never used: it is rebuilt. Builds go
# to a temporary directory first and are moved into place atomically.
#
# usage: hack/build-tools.sh [--print-path] [group...]
#   groups: kubernetes etcd kwok helm training-operator (default: these)
#           kubernetes-node (kubelet, kube-proxy) coredns
#           containerd (containerd, containerd-shim-runc-v2, ctr): the real
#           node's, built only when named (hack/real-node.sh does)
#   --print-path   print a PATH fragment (colon-separated tool dirs) and exit
#
# env: DYNAMICCL_CACHE   cache root
#      DYNAMICCL_BUILD_JOBS  go build -p (default 2)
#      GOPROXY           honoured as usual
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


ALL_GROUPS=(kubernetes etcd kwok helm training-operator)
NODE_GROUPS=(kubernetes-node coredns containerd)

group_tools() {
  case "$1" in
    kubernetes) echo "kube-apiserver kube-controller-manager kube-scheduler kubectl" ;;
    etcd|kwok|helm|training-operator|coredns) echo "$1" ;;
    kubernetes-node) echo "kubelet kube-proxy" ;;
    containerd) echo "containerd containerd-shim-runc-v2 ctr" ;;
    *) return 1 ;;
  esac
}

# Import path of the main package that produces binary $1.
tool_pkg() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy) echo "k8s.io/kubernetes/cmd/$1" ;;
    coredns) echo "github.com/coredns/coredns" ;;
    containerd|containerd-shim-runc-v2|ctr) echo "github.com/containerd/containerd/v2/cmd/$1" ;;
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    kwok) echo "sigs.k8s.io/kwok/cmd/kwok" ;;
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    training-operator) echo "github.com/kubeflow/training-operator/cmd/training-operator.v1" ;;
  esac
}

# Module whose version the group is pinned to (must be required by the wrapper).
group_module() {
  case "$1" in
    kubernetes|kubernetes-node) echo "k8s.io/kubernetes ${KUBERNETES_VERSION}" ;;
    coredns) echo "github.com/coredns/coredns ${COREDNS_VERSION}" ;;
    containerd) echo "github.com/containerd/containerd/v2 ${CONTAINERD_VERSION}" ;;
    etcd) echo "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" ;;
    kwok) echo "sigs.k8s.io/kwok ${KWOK_VERSION}" ;;
    helm) echo "helm.sh/helm/v3 ${HELM_VERSION}" ;;
    training-operator) echo "github.com/kubeflow/training-operator ${TRAINING_OPERATOR_VERSION}" ;;
  esac
}

# Release metadata of module "$1@$2" from the module cache (.info file):
# prints "<commit-or-empty> <RFC3339 time>".
module_meta() {
  # module paths here are lower case, so no !-escaping is needed
  local info="${GOMODCACHE}/cache/download/$1/@v/$2.info"
  local hash="" time="1970-01-01T00:00:00Z"
  if [[ -f "${info}" ]]; then
    hash="$(sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' "${info}")"
    time="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${info}")"
  fi
  echo "${hash:-none} ${time}"
}

group_ldflags() {
  local group="$1" commit date
  local mod ver
  read -r mod ver < <(group_module "${group}")
  read -r commit date < <(module_meta "${mod}" "${ver}")
  [[ "${commit}" == none ]] && commit=""
  local f=(-s -w)
  case "${group}" in
    kubernetes|kubernetes-node)
      local v="${KUBERNETES_VERSION}" major minor pkg
      major="${v#v}"; major="${major%%.*}"
      minor="${v#v*.}"; minor="${minor%%.*}"
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=("-X ${pkg}.gitVersion=${v}" "-X ${pkg}.gitMajor=${major}" "-X ${pkg}.gitMinor=${minor}"
            "-X ${pkg}.gitCommit=${commit}" "-X ${pkg}.gitTreeState=clean" "-X ${pkg}.buildDate=${date}")
      done ;;
    etcd)
      f+=("-X go.etcd.io/etcd/api/v3/version.GitSHA=${commit:-v${ETCD_VERSION#v}}") ;;
    kwok)
      f+=("-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
          "-X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBERNETES_VERSION#v}") ;;
    helm)
      local kv kmaj kmin
      kv="$(awk '$1 == "k8s.io/client-go" {print $2}' "${HACK_DIR}/gomod/helm/go.mod")"
      kv="${kv#v}"; kmaj="$(( ${kv%%.*} + 1 ))"; kmin="${kv#*.}"; kmin="${kmin%%.*}"
      f+=("-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
          "-X helm.sh/helm/v3/internal/version.gitCommit=${commit}"
          "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"
          "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${kmaj}"
          "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${kmin}"
          "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${kmaj}"
          "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${kmin}") ;;
    training-operator) ;;
    coredns)
      f+=("-X github.com/coredns/coredns/coremain.GitCommit=${commit:-${COREDNS_VERSION}}") ;;
    containerd)
      local pkg=github.com/containerd/containerd/v2
      f+=("-X ${pkg}/version.Version=${CONTAINERD_VERSION}" "-X ${pkg}/version.Revision=${commit}"
          "-X ${pkg}/version.Package=${pkg}") ;;
  esac
  echo "${f[*]}"
}

# Build tags of a group (go build -tags). containerd: upstream's release tags,
# without the snapshotters the real node disables (btrfs needs cgo anyway,
# devmapper, zfs); CGO_ENABLED=0 makes all three binaries static.
group_tags() {
  case "$1" in
    containerd) echo "urfave_cli_no_docs,no_btrfs,no_devmapper,no_zfs" ;;
  esac
}

# Bump when the build recipe (flags, ldflags logic) changes: forces rebuilds.
BUILD_RECIPE=1

# Fingerprint of everything that determines a group's output.
group_fingerprint() {
  local d="${HACK_DIR}/gomod/$1"
  local tags
  tags="$(group_tags "$1")"
  { cat "${d}/go.mod" "${d}/go.sum" "${d}/tools.go"; echo "recipe=${BUILD_RECIPE}"
    [[ -z "${tags}" ]] || echo "tags=${tags}"; } | sha256sum | cut -c1-16
}

group_is_current() { # group fingerprint
  local t d
  for t in $(group_tools "$1"); do
    d="$(tool_dir "$t")"
    [[ -x "${d}/${t}" && -f "${d}/.complete" ]] || return 1
    grep -qx "fingerprint=$2" "${d}/.complete" || return 1
  done
}

build_group() {
  local group="$1" ldflags tags fp mod ver log tmp t pkgs=() start
  fp="$(group_fingerprint "${group}")"
  read -r mod ver < <(group_module "${group}")
  if group_is_current "${group}" "${fp}"; then
    info "ok     ${group} ${ver} (cached)"
    return 0
  fi
  grep -Eq "^(require )?[[:space:]]*${mod//./\\.} ${ver//./\\.}( |$)" "${HACK_DIR}/gomod/${group}/go.mod" ||
    die "hack/gomod/${group}/go.mod does not require ${mod} ${ver} (from hack/versions.env); run hack/update-gomod.sh ${group}"

  log="${LOG_DIR}/${group}.log"
  : >"${log}"
  info "build  ${group} ${ver} (log: ${log})"
  start=${SECONDS}
  if ! (cd "${HACK_DIR}/gomod/${group}" && go mod download -x) >>"${log}" 2>&1; then
    die "failed to download modules for ${group} ${ver} (check GOPROXY / network); see ${log}"
  fi
  ldflags="$(group_ldflags "${group}")"
  tags="$(group_tags "${group}")"
  echo "ldflags: ${ldflags}" >>"${log}"
  echo "tags: ${tags}" >>"${log}"

  tmp="$(mktemp -d "${TOOLS_BIN_ROOT}/.tmp-${group}-XXXXXX")"
  TMP_DIRS+=("${tmp}")
  for t in $(group_tools "${group}"); do
    pkgs+=("$(tool_pkg "$t")")
    mkdir -p "${tmp}/${t}-${ver}"
  done
  # One go build for all packages of a group so shared packages compile once.
  if ! (cd "${HACK_DIR}/gomod/${group}" &&
        go build -p "${DYNAMICCL_BUILD_JOBS:-2}" -trimpath -tags "${tags}" -ldflags "${ldflags}" \
          -o "${tmp}/out/" "${pkgs[@]}") >>"${log}" 2>&1; then
    die "go build failed for ${group} ${ver}; see ${log}"
  fi
  for t in $(group_tools "${group}"); do
    local built
    built="${tmp}/out/$(basename "$(tool_pkg "$t")")"
    [[ "$t" == etcd ]] && built="${tmp}/out/server"
    [[ -x "${built}" ]] || die "go build for ${group} produced no binary for ${t} (expected ${built}); see ${log}"
    mv "${built}" "${tmp}/${t}-${ver}/${t}"
    printf 'name=%s\nversion=%s\nfingerprint=%s\ngo=%s\nbuilt=%s\n' \
      "$t" "${ver}" "${fp}" "$(go env GOVERSION)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"${tmp}/${t}-${ver}/.complete"
    # Replace any stale/half-built dir; the stamped dir appears in one rename.
    rm -rf "$(tool_dir "$t")"
    mv "${tmp}/${t}-${ver}" "$(tool_dir "$t")"
  done
  rm -rf "${tmp}"
  info "done   ${group} ${ver} in $((SECONDS - start))s"
}

check_go() {
  command -v go >/dev/null 2>&1 || die "go toolchain not found (need go >= ${GO_MIN_VERSION} on PATH)"
  local v
  v="$(cd / && GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" || die "go toolchain not working (need go >= ${GO_MIN_VERSION} on PATH)"
  v="${v#go}"
  local maj="${v%%.*}" rest="${v#*.}"
  local min="${rest%%[^0-9]*}"
  local wmaj="${GO_MIN_VERSION%%.*}" wmin="${GO_MIN_VERSION#*.}"
  if (( maj < wmaj || (maj == wmaj && min < wmin) )); then
    die "go toolchain ${v} too old (need go >= ${GO_MIN_VERSION} on PATH)"
  fi
}

print_path=0
groups=()
for a in "$@"; do
  case "$a" in
    --print-path) print_path=1 ;;
    -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
    -*) die "unknown option $a" ;;
    *) group_tools "$a" >/dev/null || die "unknown group '$a' (one of: ${ALL_GROUPS[*]} ${NODE_GROUPS[*]})"; groups+=("$a") ;;
  esac
done
[[ ${#groups[@]} -gt 0 ]] || groups=("${ALL_GROUPS[@]}")

if (( print_path )); then
  p=()
  for t in "${ALL_TOOLS[@]}"; do p+=("$(tool_dir "$t")"); done
  (IFS=:; echo "${p[*]}")
  exit 0
fi

check_go
go_env
LOG_DIR="${DYNAMICCL_CACHE}/logs/build-tools"
mkdir -p "${TOOLS_BIN_ROOT}" "${LOG_DIR}"

TMP_DIRS=()
cleanup() { local d; for d in "${TMP_DIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

# One builder at a time per cache (another checkout may be building too).
exec 9>"${TOOLS_BIN_ROOT}/.lock"
if ! flock -n 9; then
  info "another build-tools.sh holds ${TOOLS_BIN_ROOT}/.lock; waiting"
  flock 9
fi

total_start=${SECONDS}
for g in "${groups[@]}"; do
  build_group "$g"
done
info "all tools ready in ${TOOLS_BIN_ROOT} ($((SECONDS - total_start))s)"

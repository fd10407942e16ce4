#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Install the Debian packages that `make images` and the real node need
# (a fresh CI machine has none of them). Idempotent: packages already
# installed are not touched and apt is not called at all.
#
# usage: hack/host-packages.sh GROUP...
#   images     buildah, mmdebstrap (daemonless image builds, Debian base images)
#   node       runc, CNI plugins, iptables, conntrack (the real node; its
#              containerd is built from Go modules by hack/build-tools.sh)
# Needs root (apt-get). Prints nothing when everything is already there.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

group_packages() {
  case "$1" in
    images) echo "buildah mmdebstrap ca-certificates" ;;
    node) echo "runc containernetworking-plugins iptables conntrack iproute2 util-linux socat" ;;
    *) return 1 ;;
  esac
}

want=()
for g in "$@"; do
  pk="$(group_packages "$g")" || die "unknown group '$g' (images, node)"
  for p in ${pk}; do
    dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || want+=("$p")
  done
done
(( ${#want[@]} )) || exit 0
[[ "$(id -u)" == 0 ]] || die "need root to install: ${want[*]}"

# Several scripts may ask at once: dpkg has its own lock, but apt-get fails
# instead of waiting on it. Serialise here.
exec 7>/var/lock/dynamiccl-host-packages.lock
flock 7
start=${SECONDS}
info "installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
# apt lists older than a day (or none): refresh first.
if [[ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]]; then
  apt-get update -qq >&2 || die "apt-get update failed"
fi
apt-get install -y -qq --no-install-recommends "${want[@]}" >&2 ||
  die "apt-get install ${want[*]} failed"
info "installed in $((SECONDS - start))s"

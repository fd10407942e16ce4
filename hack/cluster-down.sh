#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stop the local control plane started by hack/cluster-up.sh.
#
# usage: hack/cluster-down.sh [--wipe]
#   --wipe   also delete the cluster state dir (etcd data, certificates, logs);
#            without it the next cluster-up.sh resumes the same cluster.
# Only processes recorded in $DYNAMICCL_CLUSTER_DIR/pids whose executable is
# still the expected binary are signalled (SIGTERM, then SIGKILL after 15s).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"


wipe=0
for a in "$@"; do
  case "$a" in
    --wipe) wipe=1 ;;
    -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
    *) echo "${PROG}: error: unknown argument $a" >&2; exit 2 ;;
  esac
done

if [[ ! -d "${CLUSTER_DIR}" ]]; then
  info "no cluster at ${CLUSTER_DIR}; nothing to do"
  exit 0
fi
mkdir -p "${PID_DIR}"
exec 8>"${CLUSTER_DIR}/cluster.lock"
flock -n 8 || { info "another cluster-up/down is running on ${CLUSTER_DIR}; waiting"; flock 8; }
rm -f "${CLUSTER_DIR}/.up"

# The real node first (while the apiserver is up): its containers, network
# namespaces, mounts, iptables rules and bridge (hack/real-node.sh down).
if [[ -d "${CLUSTER_DIR}/node" ]]; then
  if [[ "$(id -u)" == 0 ]]; then
    bash "${HACK_DIR}/real-node.sh" down 8>&-
  else
    info "a real node was started here; stopping it needs root (hack/real-node.sh down)"
  fi
fi

stopped=0
for (( i=${#COMPONENTS[@]}-1; i>=0; i-- )); do
  c="${COMPONENTS[$i]}"
  if pid="$(component_pid "$c")"; then
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 150); do
      component_pid "$c" >/dev/null || break
      sleep 0.1
    done
    if component_pid "$c" >/dev/null; then
      info "$c (pid ${pid}) ignored SIGTERM; sending SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.2
    fi
    info "stopped $c (pid ${pid})"
    stopped=$((stopped + 1))
  fi
  rm -f "${PID_DIR}/$c.pid"
done
(( stopped )) || info "nothing was running"

if (( wipe )); then
  rm -rf "${CLUSTER_DIR}"
  info "wiped ${CLUSTER_DIR}"
fi

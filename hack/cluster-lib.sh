# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
# shellcheck disable=SC2034  # variables are used by the scripts that source this file
# Settings shared by hack/cluster-up.sh and hack/cluster-down.sh. Source it.

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR="${DYNAMICCL_CLUSTER_DIR:-${DYNAMICCL_CACHE}/cluster}"
PKI_DIR="${CLUSTER_DIR}/pki"
PID_DIR="${CLUSTER_DIR}/pids"
LOG_DIR="${CLUSTER_DIR}/logs"
KCFG_DIR="${CLUSTER_DIR}/kubeconfigs"
KUBECONFIG_PATH="${CLUSTER_DIR}/kubeconfig"

# Loopback ports. Everything derives from one base so a second cluster on the
# same machine only needs DYNAMICCL_PORT_BASE; each is overridable on its own.
PORT_BASE="${DYNAMICCL_PORT_BASE:-42000}"
ETCD_PORT="${DYNAMICCL_ETCD_PORT:-$((PORT_BASE + 379))}"
ETCD_PEER_PORT="${DYNAMICCL_ETCD_PEER_PORT:-$((PORT_BASE + 380))}"
APISERVER_PORT="${DYNAMICCL_APISERVER_PORT:-$((PORT_BASE + 443))}"
KCM_PORT="${DYNAMICCL_KCM_PORT:-$((PORT_BASE + 257))}"
SCHEDULER_PORT="${DYNAMICCL_SCHEDULER_PORT:-$((PORT_BASE + 259))}"
KWOK_HEALTH_PORT="${DYNAMICCL_KWOK_PORT:-$((PORT_BASE + 247))}"
TO_METRICS_PORT="${DYNAMICCL_TO_METRICS_PORT:-$((PORT_BASE + 80))}"
TO_PROBE_PORT="${DYNAMICCL_TO_PROBE_PORT:-$((PORT_BASE + 81))}"
TO_WEBHOOK_PORT="${DYNAMICCL_TO_WEBHOOK_PORT:-$((PORT_BASE + 943))}"

SERVICE_CIDR="10.96.0.0/16"
SERVICE_FIRST_IP="10.96.0.1"
POD_CIDR="10.244.0.1/16"

# Start order; cluster-down stops in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok training-operator)

# pid of a running component, or nothing. Checks the process is really ours
# (same binary) so a recycled pid is never reported or killed.
component_pid() { pidfile_runs "${PID_DIR}/$1.pid" "$1"; }

#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real node next to the kwok nodes of the local control plane: real
# containers on this machine, as local processes:
#   containerd, its runc shim and ctr (built from the pinned
#   github.com/containerd/containerd/v2 module), runc and the CNI plugins
#   (Debian's: bridge, host-local, portmap, loopback), kubelet and kube-proxy
#   (built from the pinned k8s.io/kubernetes like the control plane), CoreDNS
#   (built from its Go module) answering the cluster's kube-dns Service, and a
#   loopback proxy that lets pods reach the apiserver through the `kubernetes`
#   Service.
# The pause image is built here (k8s.io/kubernetes' pause.c, static) and the
# images of `make images` are imported straight into containerd.
#
# The node is `real-node-0`, labelled dynamiccl.io/real-node=true and tainted
# dynamiccl.io/real-node=true:NoSchedule: only pods that tolerate the taint
# (the `real` test tier) land on it; everything meant for kwok nodes stays there.
#
# usage: hack/real-node.sh up [--with-trainer] [--no-images | --no-build]
#        hack/real-node.sh down
#   up             start (idempotent: running components are left alone)
#   --with-trainer also import the trainer image (~6 GB unpacked)
#   --no-images    do not build/import the product images (pause only)
#   --no-build     import the images hack/images.sh built last (images.env)
#                  without building the working tree's
#   down           stop everything and remove what the node made: processes,
#                  containers, network namespaces, mounts, iptables rules, cni0
# Needs root, and the control plane of hack/cluster-up.sh running (for up).
# env: DYNAMICCL_CACHE, DYNAMICCL_CLUSTER_DIR, DYNAMICCL_PORT_BASE
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"

NODE_NAME="real-node-0"
NODE_DIR="${CLUSTER_DIR}/node"
NODE_LABEL="dynamiccl.io/real-node"
POD_SUBNET="10.245.0.0/24"     # this node's pods (kwok's fake pod IPs are 10.244.0.0/16)
POD_GATEWAY="10.245.0.1"
CLUSTER_POD_CIDR="10.245.0.0/16"
DNS_SERVICE_IP="10.96.0.10"
BRIDGE="cni0"
KUBELET_PORT="${DYNAMICCL_KUBELET_PORT:-$((PORT_BASE + 250))}"
KUBELET_HEALTHZ_PORT="${DYNAMICCL_KUBELET_HEALTHZ_PORT:-$((PORT_BASE + 248))}"
PROXY_HEALTHZ_PORT="${DYNAMICCL_KUBE_PROXY_HEALTHZ_PORT:-$((PORT_BASE + 256))}"
PROXY_METRICS_PORT="${DYNAMICCL_KUBE_PROXY_METRICS_PORT:-$((PORT_BASE + 249))}"
DNS_PORT="${DYNAMICCL_DNS_PORT:-$((PORT_BASE + 53))}"
DNS_HEALTH_PORT="${DYNAMICCL_DNS_HEALTH_PORT:-$((PORT_BASE + 54))}"
DNS_READY_PORT="${DYNAMICCL_DNS_READY_PORT:-$((PORT_BASE + 55))}"
APISERVER_POD_PORT="${DYNAMICCL_APISERVER_POD_PORT:-$((PORT_BASE + 444))}"
SOCK="${NODE_DIR}/containerd/containerd.sock"
PAUSE_REF="registry.k8s.io/pause:${PAUSE_VERSION}"
# start order; down stops in reverse
NODE_COMPONENTS=(containerd socat coredns kube-proxy kubelet)

node_pid() { pidfile_runs "${NODE_DIR}/pids/$1.pid" "$1"; } # component_pid's, for the node

# The address pods and the apiserver reach this node at: the machine's
# source address towards its default route.
node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}'
}

# The node's ctr: the built one (the same version as its containerd); before a
# first build, the one on PATH (a node started by an older hack/real-node.sh
# ran Debian's containerd). Quiet about cgroup v1's deprecation: said once, in
# containerd's log.
ctr_bin() { tool_bin ctr 2>/dev/null || command -v ctr || echo ctr; }
ctr_() {
  CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1 "${CTR:=$(ctr_bin)}" --address "${SOCK}" --namespace k8s.io "$@"
}

# ================================================================ down
stop_pid() { # NAME PID
  kill -TERM "$2" 2>/dev/null || true
  local _
  for _ in $(seq 1 100); do
    node_pid "$1" >/dev/null || return 0
    sleep 0.1
  done
  info "$1 (pid $2) ignored SIGTERM; sending SIGKILL"
  kill -KILL "$2" 2>/dev/null || true
  sleep 0.2
}

# Rules and chains of kube-proxy (KUBE-*), the kubelet (KUBE-*) and the CNI
# plugins (CNI-*): nothing else on this machine makes chains with these names.
iptables_cleanup() {
  local ipt table chain
  for ipt in iptables ip6tables; do
    command -v "${ipt}" >/dev/null 2>&1 || continue
    for table in nat filter mangle; do
      "${ipt}" -t "${table}" -S >/dev/null 2>&1 || continue
      # rules that jump to our chains, in the built-in chains
      # (iptables -S quotes like the shell does: comments hold spaces and quotes)
      { "${ipt}" -t "${table}" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j (KUBE|CNI)-' | grep -Ev '^-A (KUBE|CNI)-' || true; } |
        while read -r line; do
          eval "\"\${ipt}\" -t \"\${table}\" ${line/-A /-D }" 2>/dev/null || true
        done
      for chain in $("${ipt}" -t "${table}" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
        "${ipt}" -t "${table}" -F "${chain}" 2>/dev/null || true
      done
      for chain in $("${ipt}" -t "${table}" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
        "${ipt}" -t "${table}" -X "${chain}" 2>/dev/null || true
      done
    done
  done
}

# Unmount everything mounted under $1 (deepest first).
umount_under() {
  local m
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || info "could not unmount $m"
    done
}

node_down() {
  [[ -d "${NODE_DIR}" ]] || { info "no real node at ${NODE_DIR}; nothing to do"; return 0; }
  local pid c i netns=() id path
  # kubelet first: it would restart what is stopped below
  if pid="$(node_pid kubelet)"; then stop_pid kubelet "${pid}"; info "stopped kubelet"; fi
  # every container: remember the pods' network namespaces, kill, delete
  if node_pid containerd >/dev/null && [[ -S "${SOCK}" ]]; then
    for id in $(ctr_ containers ls -q 2>/dev/null); do
      path="$(ctr_ containers info "${id}" 2>/dev/null |
              python3 -c 'import json, sys
for ns in json.load(sys.stdin).get("Spec", {}).get("linux", {}).get("namespaces", []):
    if ns.get("type") == "network" and ns.get("path"): print(ns["path"])' 2>/dev/null || true)"
      [[ -n "${path}" ]] && netns+=("${path}")
      ctr_ tasks kill --signal SIGKILL "${id}" >/dev/null 2>&1 || true
    done
    for id in $(ctr_ containers ls -q 2>/dev/null); do
      for i in $(seq 1 50); do
        ctr_ tasks delete "${id}" >/dev/null 2>&1 && break
        ctr_ tasks ls -q 2>/dev/null | grep -qx "${id}" || break
        sleep 0.1
      done
      ctr_ containers delete "${id}" >/dev/null 2>&1 || true
    done
  fi
  for (( i=${#NODE_COMPONENTS[@]}-1; i>=0; i-- )); do
    c="${NODE_COMPONENTS[$i]}"
    [[ "$c" == kubelet ]] && continue
    if pid="$(node_pid "$c")"; then stop_pid "$c" "${pid}"; info "stopped $c"; fi
    rm -f "${NODE_DIR}/pids/$c.pid"
  done
  rm -f "${NODE_DIR}/pids/kubelet.pid"
  # shims of this containerd that outlived it (their command line names its socket)
  local proc exe
  for proc in /proc/[0-9]*; do
    exe="$(readlink "${proc}/exe" 2>/dev/null)" || continue
    [[ "$(basename "${exe% (deleted)}")" == containerd-shim-runc-v2 ]] || continue
    [[ " $(tr '\0' ' ' <"${proc}/cmdline" 2>/dev/null) " == *" -address ${SOCK} "* ]] || continue
    if kill -KILL "${proc#/proc/}" 2>/dev/null; then info "killed shim ${proc#/proc/} that outlived containerd"; fi
  done
  # processes left in the pods' cgroups (shims that outlived containerd's kill)
  local cg
  for cg in /sys/fs/cgroup/*/kubepods; do
    [[ -d "${cg}" ]] || continue
    find "${cg}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | while read -r pid; do
      kill -KILL "${pid}" 2>/dev/null || true
    done
  done
  # the pods' network namespaces (bind mounts under /run/netns)
  for path in "${netns[@]}"; do
    umount "${path}" 2>/dev/null || umount -l "${path}" 2>/dev/null || true
    rm -f "${path}"
  done
  umount_under "${NODE_DIR}"
  # kube-proxy's own cleanup knows its rules best; then a sweep of what is left
  local kp
  if kp="$(tool_bin kube-proxy 2>/dev/null)"; then
    "${kp}" --cleanup --v 0 >/dev/null 2>&1 || true
  fi
  iptables_cleanup
  ip link show "${BRIDGE}" >/dev/null 2>&1 && ip link delete "${BRIDGE}" 2>/dev/null && info "deleted bridge ${BRIDGE}"
  # the pods' cgroups (kubelet's cgroupfs tree; empty now)
  for cg in /sys/fs/cgroup/*/kubepods; do
    [[ -d "${cg}" ]] && find "${cg}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # sysctls the node changed, back to what they were
  if [[ -f "${NODE_DIR}/sysctl.saved" ]]; then
    while read -r key value; do sysctl -qw "${key}=${value}" >/dev/null 2>&1 || true; done <"${NODE_DIR}/sysctl.saved"
    rm -f "${NODE_DIR}/sysctl.saved"
  fi
  # the Node object, if the apiserver is still there
  if [[ -s "${KUBECONFIG_PATH}" ]] && kctl() { "$(tool_bin kubectl)" --kubeconfig "${KUBECONFIG_PATH}" --request-timeout 5s "$@"; } &&
     kctl get node "${NODE_NAME}" >/dev/null 2>&1; then
    kctl delete node "${NODE_NAME}" --wait=false >/dev/null 2>&1 || true
  fi
  # state that must not survive: container and kubelet state, IP allocations
  rm -rf "${NODE_DIR}/containerd" "${NODE_DIR}/kubelet" "${NODE_DIR}/cni/ipam" "${NODE_DIR}/pod-logs" "${NODE_DIR}/.up"
  info "real node down"
}

# ================================================================ up
# write_file FILE < content: replace FILE only when the content differs (a
# running kube-proxy exits when its configuration file changes).
write_file() {
  local tmp
  tmp="$(mktemp "$1.XXXXXX")"
  cat >"${tmp}"
  if cmp -s "${tmp}" "$1"; then rm -f "${tmp}"; else mv -f "${tmp}" "$1"; fi
}

start_node() { # NAME -- CMD ARGS...
  local name="$1" pid; shift 2
  if pid="$(node_pid "${name}")"; then
    info "${name} already running (pid ${pid})"
    return 0
  fi
  launch "${name}" "${NODE_DIR}" "$@"
}

# The pause image: k8s.io/kubernetes' pause.c, static, in a one-layer OCI
# archive (cached; the key is the source and the recipe).
pause_archive() {
  local src key out c
  src="${DYNAMICCL_CACHE}/go/mod/k8s.io/kubernetes@${KUBERNETES_VERSION}/build/pause/linux/pause.c"
  [[ -f "${src}" ]] || die "pause.c not in the module cache (${src}); run hack/build-tools.sh kubernetes"
  key="$({ cat "${src}"; echo "pause ${PAUSE_VERSION} recipe=1"; } | sha256sum | cut -c1-16)"
  out="${DYNAMICCL_CACHE}/images/pause-${PAUSE_VERSION}-${key}.oci.tar"
  if [[ ! -s "${out}" ]]; then
    local tmp store="${DYNAMICCL_CACHE}/images/storage"
    tmp="$(mktemp -d)"
    gcc -Os -Wall -static -DVERSION="v${PAUSE_VERSION}" -o "${tmp}/pause" "${src}" ||
      die "could not build pause (gcc -static; Debian: gcc, libc6-dev)"
    strip "${tmp}/pause"
    local bh=(buildah --root "${store}/vfs-pause" --runroot "${store}/run-vfs-pause" --storage-driver vfs)
    c="$(BUILDAH_ISOLATION=chroot "${bh[@]}" from scratch)"
    "${bh[@]}" copy --chmod 0755 "$c" "${tmp}/pause" /pause >/dev/null
    "${bh[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    "${bh[@]}" commit -q "$c" "${PAUSE_REF}" >/dev/null
    "${bh[@]}" rm "$c" >/dev/null
    "${bh[@]}" push -q "${PAUSE_REF}" "oci-archive:${out}.tmp:${PAUSE_REF}" >/dev/null
    mv -f "${out}.tmp" "${out}"
    rm -rf "${tmp}"
    info "built ${PAUSE_REF} ($(du -k "${out}" | cut -f1) KB archive)"
  fi
  echo "${out}"
}

has_image() { local l; l="$(ctr_ images ls -q 2>/dev/null)" || return 1; grep -qxF "$1" <<<"${l}"; }

import_image() { # REF ARCHIVE
  if has_image "$1"; then
    info "ok     image $1 (in containerd)"
    return 0
  fi
  local t0=${SECONDS}
  ctr_ images import --all-platforms=false "$2" >/dev/null || die "ctr images import $2 failed"
  has_image "$1" || die "imported $2 but containerd has no image named $1 ($(ctr_ images ls -q | tr '\n' ' '))"
  info "import $1 in $((SECONDS - t0))s"
}

node_up() {
  local with_trainer="$1" images="$2"
  bash "${HACK_DIR}/host-packages.sh" node images
  for cmd in runc iptables ip socat gcc; do
    command -v "${cmd}" >/dev/null 2>&1 || die "${cmd} not found on PATH"
  done
  bash "${HACK_DIR}/build-tools.sh" kubernetes-node coredns containerd
  declare -gA BIN
  local t
  for t in kubectl kubelet kube-proxy coredns containerd containerd-shim-runc-v2 ctr; do
    BIN[$t]="$(tool_bin "$t")" || die "$t is not built"
  done
  CTR="${BIN[ctr]}"
  [[ -f "${CLUSTER_DIR}/.up" && -s "${KUBECONFIG_PATH}" ]] || die "the control plane is not up; run hack/cluster-up.sh first"
  kubectl() { "${BIN[kubectl]}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

  local nip
  nip="$(node_ip)"
  [[ -n "${nip}" ]] || die "no IPv4 default route: cannot pick the node's address"
  mkdir -p "${NODE_DIR}"/{pids,logs,kubeconfigs,cni/net.d,cni/ipam,containerd,kubelet}

  all_running() { local c; for c in "${NODE_COMPONENTS[@]}"; do node_pid "$c" >/dev/null || return 1; done; }
  if [[ -f "${NODE_DIR}/.up" ]] && all_running &&
     curl -fsS --max-time 2 "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz" >/dev/null 2>&1; then
    info "real node already up"
  else
    rm -f "${NODE_DIR}/.up"
    # ------------------------------------------------------------ kernel settings
    if [[ ! -f "${NODE_DIR}/sysctl.saved" ]]; then
      : >"${NODE_DIR}/sysctl.saved.tmp"
      for k in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables; do
        v="$(sysctl -n "$k" 2>/dev/null)" && echo "$k $v" >>"${NODE_DIR}/sysctl.saved.tmp"
      done
      mv -f "${NODE_DIR}/sysctl.saved.tmp" "${NODE_DIR}/sysctl.saved"
    fi
    sysctl -qw net.ipv4.ip_forward=1 >/dev/null
    sysctl -qw net.bridge.bridge-nf-call-iptables=1 >/dev/null 2>&1 ||
      die "net.bridge.bridge-nf-call-iptables cannot be set (br_netfilter missing?): pods could not reach Services"
    sysctl -qw net.bridge.bridge-nf-call-ip6tables=1 >/dev/null 2>&1 || true

    # ------------------------------------------------------------ identities
    gen_cert "node-${NODE_NAME}" "system:node:${NODE_NAME}" system:nodes clientAuth
    gen_cert "kubelet-serving" "${NODE_NAME}" "" serverAuth "DNS:${NODE_NAME},IP:${nip}"
    gen_cert kube-proxy system:kube-proxy "" clientAuth
    gen_cert coredns system:coredns "" clientAuth
    write_kubeconfig "${NODE_DIR}/kubeconfigs/kubelet.kubeconfig" "node-${NODE_NAME}"
    write_kubeconfig "${NODE_DIR}/kubeconfigs/kube-proxy.kubeconfig" kube-proxy
    write_kubeconfig "${NODE_DIR}/kubeconfigs/coredns.kubeconfig" coredns

    # ------------------------------------------------------------ cluster objects
    # CoreDNS's read access (upstream's system:coredns role); the apiserver's
    # client cert may use the kubelet API (logs, exec); the kube-dns and
    # kubernetes Services point at this machine (CoreDNS and the apiserver run
    # as processes here, not as pods).
    kubectl apply --server-side --force-conflicts --field-manager dynamiccl-real-node -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "dynamiccl:apiserver-kubelet-client"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: ${DNS_SERVICE_IP}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-real-node
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: dynamiccl-real-node}
addressType: IPv4
endpoints: [{addresses: ["${nip}"], conditions: {ready: true}}]
ports:
- {name: dns, port: ${DNS_PORT}, protocol: UDP}
- {name: dns-tcp, port: ${DNS_PORT}, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-real-node
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: dynamiccl-real-node}
addressType: IPv4
endpoints: [{addresses: ["${nip}"], conditions: {ready: true}}]
ports: [{name: https, port: ${APISERVER_POD_PORT}, protocol: TCP}]
EOF

    # ------------------------------------------------------------ containerd
    # containerd 2.3's own format (version 4: the servers' addresses are plugin
    # settings). What it makes lives under the node's dir: its sockets, the
    # pods' network namespaces, runc's state; only the shims' sockets are in
    # /run/containerd/s (each shim removes its own). NRI is off (it would
    # listen on /var/run/nri).
    write_file "${NODE_DIR}/containerd/config.toml" <<EOF
# Written by hack/real-node.sh.
version = 4
root = "${NODE_DIR}/containerd/root"
state = "${NODE_DIR}/containerd/state"
[plugins.'io.containerd.server.v1.grpc']
  address = "${SOCK}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "${SOCK}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "${NODE_DIR}/containerd/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "${PAUSE_REF}"
[plugins.'io.containerd.cri.v1.runtime']
  # the sandbox may not lower oom_score_adj (pause's -998): runc would fail
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${NODE_DIR}/containerd/state/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "${NODE_DIR}/cni/net.d"
EOF
    write_file "${NODE_DIR}/cni/net.d/10-dynamiccl.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "dynamiccl",
  "plugins": [
    {"type": "bridge", "bridge": "${BRIDGE}", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "${NODE_DIR}/cni/ipam",
              "ranges": [[{"subnet": "${POD_SUBNET}", "gateway": "${POD_GATEWAY}"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    # containerd looks its shim up on PATH first (Debian's may be installed)
    start_node containerd -- env PATH="$(dirname "${BIN[containerd-shim-runc-v2]}"):${PATH}" \
      "${BIN[containerd]}" --config "${NODE_DIR}/containerd/config.toml"
    wait_until "containerd socket" containerd "${NODE_DIR}" 60 ctr_ version

    # ------------------------------------------------------------ apiserver for pods, DNS, kube-proxy
    start_node socat -- socat "TCP-LISTEN:${APISERVER_POD_PORT},bind=${nip},reuseaddr,fork" \
      "TCP:127.0.0.1:${APISERVER_PORT}"
    write_file "${NODE_DIR}/Corefile" <<EOF
.:${DNS_PORT} {
    bind ${nip}
    errors
    health 127.0.0.1:${DNS_HEALTH_PORT}
    ready 127.0.0.1:${DNS_READY_PORT}
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig ${NODE_DIR}/kubeconfigs/coredns.kubeconfig dynamiccl
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
    loop
}
EOF
    start_node coredns -- "${BIN[coredns]}" -conf "${NODE_DIR}/Corefile"
    write_file "${NODE_DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "${NODE_DIR}/kubeconfigs/kube-proxy.kubeconfig"}
hostnameOverride: ${NODE_NAME}
mode: iptables
clusterCIDR: ${CLUSTER_POD_CIDR}
healthzBindAddress: 127.0.0.1:${PROXY_HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:${PROXY_METRICS_PORT}
# leave the machine's conntrack settings alone (a VM may refuse them)
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
    start_node kube-proxy -- "${BIN[kube-proxy]}" --config "${NODE_DIR}/kube-proxy.yaml"

    # ------------------------------------------------------------ kubelet
    write_file "${NODE_DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# this machine has cgroup v1 (kubelet 1.31+ refuses it unless told)
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://${SOCK}
address: ${nip}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
tlsCertFile: ${PKI_DIR}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI_DIR}/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI_DIR}/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [${DNS_SERVICE_IP}]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
# images come from ctr import, never from a registry: never collect them
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
podLogsDir: ${NODE_DIR}/pod-logs
registerWithTaints:
- {key: ${NODE_LABEL}, value: "true", effect: NoSchedule}
EOF
  fi

  # ------------------------------------------------------------ images
  local pause
  pause="$(pause_archive)"
  import_image "${PAUSE_REF}" "${pause}"
  if (( images )); then
    (( images == 2 )) || bash "${HACK_DIR}/images.sh"
    [[ -s "${DYNAMICCL_CACHE}/images/images.env" ]] || die "no images built yet; run hack/images.sh"
    # shellcheck source=/dev/null
    source "${DYNAMICCL_CACHE}/images/images.env"
    import_image "${DYNAMICCL_IMAGE}" "${DYNAMICCL_IMAGE_ARCHIVE}"
    (( with_trainer )) && import_image "${DYNAMICCL_IMAGE_TRAIN}" "${DYNAMICCL_IMAGE_TRAIN_ARCHIVE}"
  fi

  start_node kubelet -- "${BIN[kubelet]}" --config "${NODE_DIR}/kubelet.yaml" \
    --kubeconfig "${NODE_DIR}/kubeconfigs/kubelet.kubeconfig" \
    --hostname-override "${NODE_NAME}" --node-ip "${nip}" \
    --root-dir "${NODE_DIR}/kubelet" --cert-dir "${NODE_DIR}/kubelet/pki" \
    --node-labels "${NODE_LABEL}=true" --v 1
  wait_until "coredns /ready" coredns "${NODE_DIR}" 60 curl -fsS --max-time 2 "http://127.0.0.1:${DNS_READY_PORT}/ready"
  wait_until "kube-proxy /healthz" kube-proxy "${NODE_DIR}" 60 curl -fsS --max-time 2 "http://127.0.0.1:${PROXY_HEALTHZ_PORT}/healthz"
  node_ready() {
    [[ "$(kubectl get node "${NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
  }
  wait_until "node ${NODE_NAME} Ready" kubelet "${NODE_DIR}" 120 node_ready
  touch "${NODE_DIR}/.up"
  info "real node ${NODE_NAME} is Ready (${nip}; pods ${POD_SUBNET}; containerd ${SOCK})"
}

# ================================================================ main
cmd="${1:-}"; shift || true
with_trainer=0
images=1
for a in "$@"; do
  case "$a" in
    --with-trainer) with_trainer=1 ;;
    --no-images) images=0 ;;
    --no-build) images=2 ;;
    *) die "unknown argument $a" ;;
  esac
done
case "${cmd}" in
  up|down) ;;
  -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
  *) die "usage: hack/real-node.sh up|down" ;;
esac
[[ "$(id -u)" == 0 ]] || die "the real node needs root (containerd, network namespaces, iptables)"
mkdir -p "${NODE_DIR}"
exec 9>"${NODE_DIR}/.lock"
flock -n 9 || { info "another hack/real-node.sh is running; waiting"; flock 9; }
if [[ "${cmd}" == up ]]; then node_up "${with_trainer}" "${images}"; else node_down; fi

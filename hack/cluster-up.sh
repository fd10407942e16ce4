#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Start a real local Kubernetes control plane as plain processes:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#   kwok (fake kubelets for the GPU nodes of hack/nodes.yaml),
#   Kubeflow training operator (PyTorchJob & co, kubeflow.org/v1).
#
# Idempotent: components already running are left alone; a cluster that is
# fully up is reported in well under a second. State, certificates, logs and
# pid files live in ${DYNAMICCL_CLUSTER_DIR:-~/.cache/dynamiccl/v1/cluster}.
# The admin kubeconfig is $DYNAMICCL_CLUSTER_DIR/kubeconfig.
#
# usage: hack/cluster-up.sh [--no-build] [--timeout SECONDS] [--real-node [--with-trainer]]
#   --no-build   do not call hack/build-tools.sh (tools must already be built)
#   --timeout    how long to wait for each readiness step (default 180)
#   --real-node  also start the real node (hack/real-node.sh: containerd,
#                kubelet, kube-proxy, CoreDNS; needs root; builds the images)
#   --with-trainer  the real node also gets the trainer image (~6 GB)
# env: DYNAMICCL_CACHE, DYNAMICCL_CLUSTER_DIR, DYNAMICCL_PORT_BASE (default 42000)
#      and the per-port overrides listed in hack/README.md
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"

build=1
TIMEOUT=180
real_node=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) build=0 ;;
    --real-node) real_node=(up "${real_node[@]:1}") ;;
    --with-trainer) real_node=(up --with-trainer) ;;
    --timeout) TIMEOUT="$2"; shift ;;
    -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
  shift
done

for cmd in openssl curl flock setsid; do
  command -v "${cmd}" >/dev/null 2>&1 || die "${cmd} not found on PATH"
done

# ---------------------------------------------------------------- tools
(( build )) && bash "${HACK_DIR}/build-tools.sh"
declare -A BIN
for t in "${ALL_TOOLS[@]}"; do
  BIN[$t]="$(tool_bin "$t")" || die "$t is not built; run hack/build-tools.sh"
done

PYTHON=""
for p in "${DYNAMICCL_PYTHON:-}" python3 "${DYNAMICCL_CACHE}/venv/bin/python"; do
  if [[ -n "$p" ]] && "$p" -c 'import yaml' >/dev/null 2>&1; then PYTHON="$p"; break; fi
done

mkdir -p "${CLUSTER_DIR}" "${PKI_DIR}" "${PID_DIR}" "${LOG_DIR}" "${KCFG_DIR}" "${CLUSTER_DIR}/bin"
exec 8>"${CLUSTER_DIR}/cluster.lock"
flock -n 8 || { info "another cluster-up/down is running on ${CLUSTER_DIR}; waiting"; flock 8; }

kubectl() { "${BIN[kubectl]}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

print_summary() {
  cat >&2 <<EOF
${PROG}: cluster is up ($((SECONDS - START))s): https://127.0.0.1:${APISERVER_PORT}
  export KUBECONFIG=${KUBECONFIG_PATH}
  export PATH=${CLUSTER_DIR}/bin:\$PATH    # kubectl, helm (pinned builds)
  logs: ${LOG_DIR}/<component>.log     stop: hack/cluster-down.sh [--wipe]
EOF
  echo "${KUBECONFIG_PATH}"
}

# ---------------------------------------------------------------- fast path
all_running() {
  local c
  for c in "${COMPONENTS[@]}"; do component_pid "$c" >/dev/null || return 1; done
}
# (the CRD check catches a test that deleted the shared cluster's CRDs)
if all_running && [[ -f "${CLUSTER_DIR}/.up" ]] &&
   curl -fsS --max-time 3 --cacert "${PKI_DIR}/ca.crt" "https://127.0.0.1:${APISERVER_PORT}/readyz" >/dev/null 2>&1 &&
   kubectl get crd pytorchjobs.kubeflow.org >/dev/null 2>&1; then
  info "already up"
  if (( ${#real_node[@]} )); then
    exec 8>&-
    bash "${HACK_DIR}/real-node.sh" "${real_node[@]}"
  fi
  print_summary
  exit 0
fi
rm -f "${CLUSTER_DIR}/.up"

# ---------------------------------------------------------------- helpers
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for DESCRIPTION COMPONENT CMD... : wait_until with the cluster's dir and --timeout.
wait_for() { local what="$1" comp="$2"; shift 2; wait_until "${what}" "${comp}" "${CLUSTER_DIR}" "${TIMEOUT}" "$@"; }

# start NAME PORT... -- ENV... -- CMD ARGS... : launch a component unless it runs, after
# checking its ports are free.
start() {
  local name="$1"; shift
  local ports=() envs=()
  while [[ "$1" != "--" ]]; do ports+=("$1"); shift; done; shift
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done; shift
  local pid
  if pid="$(component_pid "${name}")"; then
    info "${name} already running (pid ${pid})"
    return 0
  fi
  local p
  for p in "${ports[@]}"; do
    port_free "$p" || die "port 127.0.0.1:${p} needed by ${name} is in use (another cluster? set DYNAMICCL_PORT_BASE)"
  done
  launch "${name}" "${CLUSTER_DIR}" env "${envs[@]}" "$@"
}

# ---------------------------------------------------------------- PKI
gen_pki() {
  umask 077
  gen_ca ca dynamiccl-ca
  gen_ca front-proxy-ca dynamiccl-front-proxy-ca
  gen_cert apiserver kube-apiserver "" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:${SERVICE_FIRST_IP}"
  gen_cert admin kubernetes-admin system:masters clientAuth
  gen_cert kube-controller-manager system:kube-controller-manager "" clientAuth
  gen_cert kube-scheduler system:kube-scheduler "" clientAuth
  gen_cert kwok kwok-controller system:masters clientAuth
  gen_cert apiserver-kubelet-client kube-apiserver-kubelet-client kubeadm:cluster-admins clientAuth
  gen_cert front-proxy-client front-proxy-client "" clientAuth "" front-proxy-ca
  # Webhook serving pair of the training operator, in the form its cert
  # rotator (open-policy-agent/cert-controller) accepts as valid: CA named
  # training-operator-ca, server cert for training-operator.kubeflow.svc.
  # (its CA key must be RSA PKCS#1: the rotator parses CA keys only that way)
  gen_ca to-webhook-ca training-operator-ca DNS:training-operator-ca rsa
  gen_cert to-webhook training-operator.kubeflow.svc "" serverAuth \
    DNS:training-operator.kubeflow.svc to-webhook-ca
  if [[ ! -s "${PKI_DIR}/sa.key" ]]; then
    gen_key "${PKI_DIR}/sa.key"
    openssl ec -in "${PKI_DIR}/sa.key" -pubout -out "${PKI_DIR}/sa.pub" 2>/dev/null
  fi
  umask 022
}

info "cluster dir ${CLUSTER_DIR}"
gen_pki
write_kubeconfig "${KUBECONFIG_PATH}" admin
write_kubeconfig "${KCFG_DIR}/kube-controller-manager.kubeconfig" kube-controller-manager
write_kubeconfig "${KCFG_DIR}/kube-scheduler.kubeconfig" kube-scheduler
write_kubeconfig "${KCFG_DIR}/kwok.kubeconfig" kwok
ln -sf "${BIN[kubectl]}" "${CLUSTER_DIR}/bin/kubectl"
ln -sf "${BIN[helm]}" "${CLUSTER_DIR}/bin/helm"

# ---------------------------------------------------------------- etcd
start etcd "${ETCD_PORT}" "${ETCD_PEER_PORT}" -- GOMAXPROCS=2 -- "${BIN[etcd]}" \
  --name dynamiccl --data-dir "${CLUSTER_DIR}/etcd" \
  --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
  --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
  --initial-cluster "dynamiccl=http://127.0.0.1:${ETCD_PEER_PORT}" --initial-cluster-state new \
  --unsafe-no-fsync --quota-backend-bytes 4294967296 --snapshot-count 10000 --log-level warn
wait_for "etcd health" etcd curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_PORT}/health"

# ---------------------------------------------------------------- kube-apiserver
start kube-apiserver "${APISERVER_PORT}" -- -- "${BIN[kube-apiserver]}" \
  --etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "${APISERVER_PORT}" \
  --cert-dir "${PKI_DIR}" \
  --tls-cert-file "${PKI_DIR}/apiserver.crt" --tls-private-key-file "${PKI_DIR}/apiserver.key" \
  --client-ca-file "${PKI_DIR}/ca.crt" \
  --kubelet-client-certificate "${PKI_DIR}/apiserver-kubelet-client.crt" \
  --kubelet-client-key "${PKI_DIR}/apiserver-kubelet-client.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "${PKI_DIR}/sa.pub" \
  --service-account-signing-key-file "${PKI_DIR}/sa.key" \
  --service-cluster-ip-range "${SERVICE_CIDR}" \
  --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
  --allow-privileged=true \
  --requestheader-client-ca-file "${PKI_DIR}/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --requestheader-group-headers X-Remote-Group \
  --requestheader-username-headers X-Remote-User \
  --proxy-client-cert-file "${PKI_DIR}/front-proxy-client.crt" \
  --proxy-client-key-file "${PKI_DIR}/front-proxy-client.key" \
  --endpoint-reconciler-type none \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --profiling=false
wait_for "kube-apiserver /readyz" kube-apiserver \
  curl -fsS --max-time 3 --cacert "${PKI_DIR}/ca.crt" "https://127.0.0.1:${APISERVER_PORT}/readyz"

# ---------------------------------------------------------------- controller-manager, scheduler
KCM_KCFG="${KCFG_DIR}/kube-controller-manager.kubeconfig"
start kube-controller-manager "${KCM_PORT}" -- -- "${BIN[kube-controller-manager]}" \
  --kubeconfig "${KCM_KCFG}" --authentication-kubeconfig "${KCM_KCFG}" --authorization-kubeconfig "${KCM_KCFG}" \
  --bind-address 127.0.0.1 --secure-port "${KCM_PORT}" \
  --controllers '*,-cloud-node-lifecycle-controller,-node-route-controller,-service-lb-controller' \
  --use-service-account-credentials=true \
  --service-account-private-key-file "${PKI_DIR}/sa.key" \
  --root-ca-file "${PKI_DIR}/ca.crt" \
  --cluster-signing-cert-file "${PKI_DIR}/ca.crt" --cluster-signing-key-file "${PKI_DIR}/ca.key" \
  --client-ca-file "${PKI_DIR}/ca.crt" --requestheader-client-ca-file "${PKI_DIR}/front-proxy-ca.crt" \
  --service-cluster-ip-range "${SERVICE_CIDR}" --allocate-node-cidrs=false \
  --cluster-name dynamiccl --leader-elect=false --profiling=false

SCHED_KCFG="${KCFG_DIR}/kube-scheduler.kubeconfig"
start kube-scheduler "${SCHEDULER_PORT}" -- -- "${BIN[kube-scheduler]}" \
  --kubeconfig "${SCHED_KCFG}" --authentication-kubeconfig "${SCHED_KCFG}" --authorization-kubeconfig "${SCHED_KCFG}" \
  --bind-address 127.0.0.1 --secure-port "${SCHEDULER_PORT}" \
  --leader-elect=false --profiling=false

wait_for "kube-controller-manager /healthz" kube-controller-manager \
  curl -fsSk --max-time 3 "https://127.0.0.1:${KCM_PORT}/healthz"
wait_for "kube-scheduler /healthz" kube-scheduler \
  curl -fsSk --max-time 3 "https://127.0.0.1:${SCHEDULER_PORT}/healthz"

# ---------------------------------------------------------------- fake GPU nodes + kwok
[[ -n "${PYTHON}" ]] || die "no python3 with PyYAML found (needed by hack/gen_nodes.py); set DYNAMICCL_PYTHON"
"${PYTHON}" "${HACK_DIR}/gen_nodes.py" --kube-version "${KUBERNETES_VERSION}" "${HACK_DIR}/nodes.yaml" \
  >"${CLUSTER_DIR}/nodes.json"
# server-side apply: create keeps the status (capacity, allocatable, nodeInfo);
# later runs only update labels/annotations.
kubectl apply --server-side --field-manager dynamiccl-cluster-up -f "${CLUSTER_DIR}/nodes.json" >/dev/null

cat >"${CLUSTER_DIR}/kwok.yaml" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: ${POD_CIDR}
  manageAllNodes: false
  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake
  nodeLeaseDurationSeconds: 40
  serverAddress: 127.0.0.1:${KWOK_HEALTH_PORT}
EOF
start kwok "${KWOK_HEALTH_PORT}" -- -- "${BIN[kwok]}" \
  --config "${CLUSTER_DIR}/kwok.yaml" --kubeconfig "${KCFG_DIR}/kwok.kubeconfig" \
  --v "${DYNAMICCL_KWOK_LOG_LEVEL:-WARN}"
wait_for "kwok /healthz" kwok curl -fsS --max-time 2 "http://127.0.0.1:${KWOK_HEALTH_PORT}/healthz"

# ---------------------------------------------------------------- training operator
TO_MOD_DIR="${DYNAMICCL_CACHE}/go/mod/github.com/kubeflow/training-operator@${TRAINING_OPERATOR_VERSION}"
[[ -d "${TO_MOD_DIR}/manifests/base/crds" ]] ||
  die "training-operator manifests not in the module cache (${TO_MOD_DIR}); run hack/build-tools.sh training-operator"
crd_args=()
for crd in "${TO_MOD_DIR}"/manifests/base/crds/kubeflow.org_*.yaml; do crd_args+=(-f "${crd}"); done
kubectl apply --server-side --force-conflicts --field-manager dynamiccl-cluster-up \
  "${crd_args[@]}" -f "${TO_MOD_DIR}/manifests/base/rbac/role.yaml" >/dev/null
kubectl apply --server-side --field-manager dynamiccl-cluster-up -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: kubeflow
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: training-operator
  namespace: kubeflow
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: training-operator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: training-operator
subjects:
- kind: ServiceAccount
  name: training-operator
  namespace: kubeflow
EOF
# In a real pod the rotator keeps this secret valid and the kubelet mounts it
# at the webhook cert dir. Here we pre-fill the secret with a valid pair (so
# the rotator has nothing to do) and play the kubelet's part for the files.
kubectl -n kubeflow create secret generic training-operator-webhook-cert \
  --from-file ca.crt="${PKI_DIR}/to-webhook-ca.crt" --from-file ca.key="${PKI_DIR}/to-webhook-ca.key" \
  --from-file tls.crt="${PKI_DIR}/to-webhook.crt" --from-file tls.key="${PKI_DIR}/to-webhook.key" \
  --dry-run=client -o yaml |
  kubectl apply --server-side --force-conflicts --field-manager dynamiccl-cluster-up -f - >/dev/null
wait_for "CRDs established" "" kubectl wait --for condition=established --timeout 5s \
  crd/pytorchjobs.kubeflow.org crd/tfjobs.kubeflow.org crd/mpijobs.kubeflow.org \
  crd/xgboostjobs.kubeflow.org crd/paddlejobs.kubeflow.org crd/jaxjobs.kubeflow.org

# The operator authenticates as its ServiceAccount with a bound token
# (TokenRequest + service-account token authentication, as in a real pod).
TO_KCFG="${KCFG_DIR}/training-operator.kubeconfig"
if ! component_pid training-operator >/dev/null; then
  token="$(kubectl -n kubeflow create token training-operator --duration 8760h)"
  rm -f "${TO_KCFG}"
  k=("${BIN[kubectl]}" --kubeconfig "${TO_KCFG}")
  "${k[@]}" config set-cluster dynamiccl --server "https://127.0.0.1:${APISERVER_PORT}" \
    --certificate-authority "${PKI_DIR}/ca.crt" --embed-certs >/dev/null
  "${k[@]}" config set-credentials training-operator --token "${token}" >/dev/null
  "${k[@]}" config set-context dynamiccl --cluster dynamiccl --user training-operator >/dev/null
  "${k[@]}" config use-context dynamiccl >/dev/null
  chmod 600 "${TO_KCFG}"
fi
# The rotator waits for the files in the fixed /tmp/k8s-webhook-server/serving-certs
# (also controller-runtime's default webhook cert dir when TMPDIR=/tmp). The
# path is machine-wide: a second cluster overwrites it with its own, equally
# valid pair, which is harmless as the webhook is not registered (README).
WEBHOOK_CERT_DIR=/tmp/k8s-webhook-server/serving-certs
mkdir -p "${WEBHOOK_CERT_DIR}"
for f in tls.crt tls.key; do
  tmpf="$(mktemp "${WEBHOOK_CERT_DIR}/.${f}.XXXXXX")"
  cat "${PKI_DIR}/to-webhook.${f#tls.}" >"${tmpf}"
  mv -f "${tmpf}" "${WEBHOOK_CERT_DIR}/${f}"
done
start training-operator "${TO_METRICS_PORT}" "${TO_PROBE_PORT}" "${TO_WEBHOOK_PORT}" -- \
  KUBECONFIG="${TO_KCFG}" MY_POD_NAMESPACE=kubeflow TMPDIR=/tmp -- \
  "${BIN[training-operator]}" \
  --metrics-bind-address "127.0.0.1:${TO_METRICS_PORT}" \
  --health-probe-bind-address "127.0.0.1:${TO_PROBE_PORT}" \
  --webhook-server-port "${TO_WEBHOOK_PORT}" \
  --leader-elect=false --zap-log-level info
info "waiting for training-operator /readyz"
wait_for "training-operator /readyz" training-operator \
  curl -fsS --max-time 2 "http://127.0.0.1:${TO_PROBE_PORT}/readyz"

# ---------------------------------------------------------------- readiness
want="$("${PYTHON}" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["items"]))' "${CLUSTER_DIR}/nodes.json")"
nodes_ready() {
  local n
  n="$(kubectl get nodes -l nvidia.com/gpu.present=true \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
        grep -c '^True$')" || true
  [[ "${n}" -ge "${want}" ]]
}
info "waiting for ${want} Ready GPU nodes"
wait_for "${want} Ready GPU nodes" kwok nodes_ready
wait_for "default service account" kube-controller-manager kubectl -n default get serviceaccount default

for c in "${COMPONENTS[@]}"; do
  component_pid "$c" >/dev/null || die "$c is not running; see ${LOG_DIR}/$c.log"
done
cat >"${CLUSTER_DIR}/cluster.env" <<EOF
# Written by hack/cluster-up.sh; shell-sourceable.
KUBECONFIG=${KUBECONFIG_PATH}
DYNAMICCL_CLUSTER_DIR=${CLUSTER_DIR}
DYNAMICCL_APISERVER=https://127.0.0.1:${APISERVER_PORT}
DYNAMICCL_KUBECTL=${BIN[kubectl]}
DYNAMICCL_HELM=${BIN[helm]}
EOF
touch "${CLUSTER_DIR}/.up"
if (( ${#real_node[@]} )); then
  exec 8>&-
  bash "${HACK_DIR}/real-node.sh" "${real_node[@]}"
fi
print_summary

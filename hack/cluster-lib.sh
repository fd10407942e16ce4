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

# ---------------------------------------------------------------- processes
# launch NAME DIR CMD... : start CMD in its own session (it outlives the script), log to
# DIR/logs/NAME.log (the previous one kept as .prev), pid to DIR/pids/NAME.pid.
launch() {
  local name="$1" dir="$2"; shift 2
  local log="${dir}/logs/${name}.log"
  [[ -f "${log}" ]] && mv -f "${log}" "${log}.prev"
  { echo "# $(date -u +%FT%TZ) ${PROG}: starting ${name}"; printf '# %q' "$@"; echo; } >"${log}"
  # no lock of ours (fd 8, or a caller's flock) may be inherited and held by the daemon
  (run_detached "$@") </dev/null >>"${log}" 2>&1 &
  echo $! >"${dir}/pids/${name}.pid"
  info "started ${name} (pid $!, log ${log})"
}

# wait_until DESCRIPTION COMPONENT DIR SECONDS CMD... : retry CMD until it succeeds; fail
# early (with the log tail) if COMPONENT (pid in DIR/pids, log in DIR/logs) died.
# COMPONENT may be empty.
wait_until() {
  local what="$1" comp="$2" dir="$3" secs="$4"; shift 4
  local deadline=$((SECONDS + secs)) log="${dir}/logs/${comp}.log"
  until "$@" >/dev/null 2>&1; do
    if [[ -n "${comp}" ]] && ! pid_on_its_way "${dir}/pids/${comp}.pid" "${comp}"; then
      tail -n 30 "${log}" >&2 || true
      die "${comp} exited while waiting for ${what}; see ${log}"
    fi
    if (( SECONDS >= deadline )); then
      [[ -n "${comp}" ]] && { tail -n 30 "${log}" >&2 || true; }
      die "timed out after ${secs}s waiting for ${what}${comp:+; see ${log}}"
    fi
    sleep 0.5
  done
}

# ---------------------------------------------------------------- PKI
# gen_key FILE [rsa]: a private key (mode 600): ECDSA P-256 (fast to generate), or RSA 2048 in PKCS#1
# form where a consumer insists on it.
gen_key() {
  if [[ "${2:-}" == rsa ]]; then
    (umask 077; openssl genrsa -traditional -out "$1" 2048 2>/dev/null)
  else
    (umask 077; openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null)
  fi
}

# gen_cert NAME CN O EXTKEYUSAGE [SAN] [CA]  -> pki/NAME.{crt,key}
gen_cert() {
  local name="$1" cn="$2" org="$3" eku="$4" san="${5:-}" ca="${6:-ca}"
  [[ -s "${PKI_DIR}/${name}.crt" && -s "${PKI_DIR}/${name}.key" ]] && return 0
  local subj="/CN=${cn}"
  [[ -n "${org}" ]] && subj="/O=${org}${subj}"
  local ext="${PKI_DIR}/${name}.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=${eku}"
    [[ -n "${san}" ]] && echo "subjectAltName=${san}"
  } >"${ext}"
  gen_key "${PKI_DIR}/${name}.key"
  openssl req -new -key "${PKI_DIR}/${name}.key" -subj "${subj}" -out "${PKI_DIR}/${name}.csr" 2>/dev/null
  openssl x509 -req -in "${PKI_DIR}/${name}.csr" -CA "${PKI_DIR}/${ca}.crt" -CAkey "${PKI_DIR}/${ca}.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "${ext}" -out "${PKI_DIR}/${name}.crt" 2>/dev/null
  rm -f "${PKI_DIR}/${name}.csr" "${ext}"
}

gen_ca() { # NAME CN [SAN] [rsa]
  [[ -s "${PKI_DIR}/$1.crt" && -s "${PKI_DIR}/$1.key" ]] && return 0
  local san=()
  [[ -n "${3:-}" ]] && san=(-addext "subjectAltName=$3")
  gen_key "${PKI_DIR}/$1.key" "${4:-}"
  openssl req -x509 -new -key "${PKI_DIR}/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    "${san[@]}" -out "${PKI_DIR}/$1.crt" 2>/dev/null
}

# write_kubeconfig FILE USER (client cert pki/USER.{crt,key}, mode 600), written directly:
# 4 `kubectl config` calls per file took most of cluster-up's certificate phase.
write_kubeconfig() {
  local f="$1" user="$2"
  [[ -s "${f}" ]] && grep -q "127.0.0.1:${APISERVER_PORT}" "${f}" && return 0
  local ca crt key
  ca="$(base64 -w0 "${PKI_DIR}/ca.crt")"
  crt="$(base64 -w0 "${PKI_DIR}/${user}.crt")"
  key="$(base64 -w0 "${PKI_DIR}/${user}.key")"
  rm -f "${f}"
  (umask 077; cat >"${f}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dynamiccl
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority-data: ${ca}
users:
- name: ${user}
  user:
    client-certificate-data: ${crt}
    client-key-data: ${key}
contexts:
- name: dynamiccl
  context:
    cluster: dynamiccl
    user: ${user}
current-context: dynamiccl
EOF
  )
}

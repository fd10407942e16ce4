#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build both images of the Dockerfile (runtime, trainer) on this machine, with
# no registry and no Docker engine:
#   * buildah (Debian's package, daemonless, chroot isolation) runs the
#     Dockerfile unchanged, with its base images given as build arguments;
#   * the base images are made here from Debian packages (mmdebstrap, the
#     machine's own apt sources): "debian" (minbase, for the plugin's build
#     stage), "python" (minbase + python3 + venv, for the Python build stages
#     and the trainer) and "python-run" (the runtime's: Debian's essential
#     packages + python3, no apt, no pip wheels, no gconv modules);
#   * the results are OCI archives, cached by content: the key hashes the
#     Dockerfile, every file of the build context, the base images' recipes
#     and this script's recipe. A warm run only hashes and prints.
#
# usage: hack/images.sh [--print-env] [--force]
#   --print-env   print the images.env of the current key (build if needed)
#   --force       rebuild even when the archives of the current key exist
# env: DYNAMICCL_CACHE
#      DYNAMICCL_IMAGE_STORAGE_DRIVER  overlay | vfs (default: overlay when
#                                      it works here, else vfs)
#      DYNAMICCL_TORCH_INDEX_URL       extra pip index for torch (default
#                                      empty: PyPI only, the pytorch.org index
#                                      is not reachable from CI machines)
# outputs, under $DYNAMICCL_CACHE/images/:
#   dynamiccl-<key>.oci.tar        runtime   (localhost/dynamiccl:<key>)
#   dynamiccl-<key>-train.oci.tar  trainer   (localhost/dynamiccl:<key>-train)
#   images.env                     DYNAMICCL_IMAGE=..., archives, sizes (sourceable)
#   base/<name>-<key>.tar          Debian root filesystems of the base images
#   storage/                       buildah's image store (layer cache)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


print_env=0
force=0
for a in "$@"; do
  case "$a" in
    --print-env) print_env=1 ;;
    --force) force=1 ;;
    -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument $a" ;;
  esac
done

# Bump when the recipe below changes in a way the hashed inputs do not show.
IMAGES_RECIPE=1
IMAGE_REPO="localhost/dynamiccl"
SUITE="bookworm"
IMG_DIR="${DYNAMICCL_CACHE}/images"
BASE_DIR="${IMG_DIR}/base"
STORE="${IMG_DIR}/storage"
mkdir -p "${BASE_DIR}" "${STORE}"

# Base images: name -> Debian packages on top of its variant.
base_packages() {
  case "$1" in
    debian) echo "" ;;
    python) echo "python3 python3-venv ca-certificates" ;;
    python-run) echo "python3 ca-certificates libstdc++6" ;; # libstdc++: numpy's
  esac
}
# name -> mmdebstrap variant and the extra paths dpkg leaves out. "essential"
# is minbase without apt (and the libraries only apt needs); glibc's gconv
# modules serve iconv(3) for legacy charsets, which nothing in the runtime calls.
base_variant() { [[ "$1" == python-run ]] && echo essential || echo minbase; }
base_excludes() { [[ "$1" == python-run ]] && echo "/usr/lib/*/gconv/*" || true; }
BASES=(debian python python-run)

# The machine's apt sources, as mmdebstrap reads them (deb822 or one-line).
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    cat "$f"
    echo
  done
}

base_key() { # (minbase keys read as before variants existed: their cached images stay valid)
  { echo "recipe=${IMAGES_RECIPE} suite=${SUITE} packages=$(base_packages "$1")"
    [[ "$(base_variant "$1")" == minbase ]] ||
      echo "variant=$(base_variant "$1") excludes=$(base_excludes "$1")"
    apt_sources; } | sha256sum | cut -c1-16
}

# Files of the build context: the Dockerfile's COPY sources, tracked or new
# (not ignored), as they are in the working tree.
CONTEXT_PATHS=(Dockerfile .dockerignore pyproject.toml README.md hack/torch_cpu_stubs.py hack/slim_venv.py plugin dynamiccl operator policy sidecar node_agent)
context_files() {
  (cd "${REPO_ROOT}" && git ls-files -z --cached --others --exclude-standard -- "${CONTEXT_PATHS[@]}" |
    sort -zu | while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done)
}

# Hash of one file list: names, modes, symlink targets and contents.
context_hash() {
  (cd "${REPO_ROOT}" && context_files | while IFS= read -r -d '' f; do
    if [[ -L "$f" ]]; then
      printf 'L %s %s\n' "$f" "$(readlink "$f")"
    else
      printf 'F %s %s %s\n' "$f" "$(stat -c %a "$f")" "$(sha256sum <"$f" | cut -c1-64)"
    fi
  done) | sha256sum | cut -c1-64
}

TORCH_INDEX_URL="${DYNAMICCL_TORCH_INDEX_URL:-}"
declare -A BKEY
for b in "${BASES[@]}"; do BKEY[$b]="$(base_key "$b")"; done
KEY="$({ echo "recipe=${IMAGES_RECIPE} torch_index=${TORCH_INDEX_URL}"
         for b in "${BASES[@]}"; do echo "base ${b} ${BKEY[$b]}"; done
         context_hash; } | sha256sum | cut -c1-16)"
RUNTIME_REF="${IMAGE_REPO}:${KEY}"
TRAINER_REF="${IMAGE_REPO}:${KEY}-train"
RUNTIME_TAR="${IMG_DIR}/dynamiccl-${KEY}.oci.tar"
TRAINER_TAR="${IMG_DIR}/dynamiccl-${KEY}-train.oci.tar"
ENV_FILE="${IMG_DIR}/images.env"
KEY_ENV="${IMG_DIR}/dynamiccl-${KEY}.env"

finish() {
  cp -f "${KEY_ENV}" "${ENV_FILE}.tmp" && mv -f "${ENV_FILE}.tmp" "${ENV_FILE}"
  if (( print_env )); then cat "${ENV_FILE}"; fi
}

if (( ! force )) && [[ -s "${RUNTIME_TAR}" && -s "${TRAINER_TAR}" && -s "${KEY_ENV}" ]]; then
  info "ok     images ${KEY} (cached: ${RUNTIME_TAR##*/}, ${TRAINER_TAR##*/})"
  finish
  exit 0
fi

# ---------------------------------------------------------------- build
bash "${HACK_DIR}/host-packages.sh" images
[[ "$(id -u)" == 0 ]] || die "needs root (buildah with chroot isolation, mmdebstrap)"

exec 9>"${IMG_DIR}/.lock"
if ! flock -n 9; then
  info "another hack/images.sh holds ${IMG_DIR}/.lock; waiting"
  flock 9
fi

export BUILDAH_ISOLATION=chroot
DRIVER="${DYNAMICCL_IMAGE_STORAGE_DRIVER:-}"
bh() { buildah --root "${STORE}/${DRIVER}" --runroot "${STORE}/run-${DRIVER}" --storage-driver "${DRIVER}" "$@"; }
if [[ -z "${DRIVER}" ]]; then
  # overlay keeps one copy of each layer (vfs copies the whole tree per layer:
  # several GB for the trainer); it fails where the cache sits on overlayfs.
  DRIVER=overlay
  if ! c="$(bh from scratch 2>/dev/null)" || ! bh mount "$c" >/dev/null 2>&1; then
    info "overlay storage does not work here; using vfs"
    DRIVER=vfs
  fi
  [[ -n "${c:-}" ]] && bh rm "$c" >/dev/null 2>&1 || true
fi
info "buildah $(buildah --version | awk '{print $3}'), storage ${DRIVER} in ${STORE}/${DRIVER}"
# working containers of an interrupted build (we hold the store's lock: none is in use)
bh rm --all >/dev/null 2>&1 || true

image_exists() { bh inspect --type image "$1" >/dev/null 2>&1; }

# make_base NAME: Debian root filesystem (cached tar) -> local base image
# BASE_REF[NAME].
declare -A BASE_REF
make_base() {
  local name="$1" key="${BKEY[$1]}" ref="localhost/dynamiccl-base/$1:${BKEY[$1]}"
  local tar="${BASE_DIR}/$1-${key}.tar" pk hooks=() excl=() t0=${SECONDS} x xs
  BASE_REF[${name}]="${ref}"
  if image_exists "${ref}"; then
    info "ok     base ${name} (${ref})"
    return 0
  fi
  if [[ ! -s "${tar}" ]]; then
    pk="$(base_packages "${name}")"
    # merged /usr without the usrmerge package (which pulls in all of perl)
    [[ -d /usr/share/mmdebstrap/hooks/merged-usr ]] && hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
    read -ra xs <<<"$(base_excludes "${name}")" # (patterns for dpkg: no globbing here)
    for x in "${xs[@]}"; do excl+=("--dpkgopt=path-exclude=${x}"); done
    info "build  base ${name}: mmdebstrap $(base_variant "${name}") ${SUITE} ${pk:++ ${pk}}"
    apt_sources | mmdebstrap --quiet --variant="$(base_variant "${name}")" "${hooks[@]}" "${excl[@]}" \
      ${pk:+--include="${pk// /,}"} \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
      --format=tar "${SUITE}" "${tar}.tmp" - >&2 || die "mmdebstrap failed for base ${name}"
    mv -f "${tar}.tmp" "${tar}"
  fi
  local c m
  c="$(bh from scratch)"
  m="$(bh mount "$c")"
  tar -C "$m" --numeric-owner -xpf "${tar}"
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label "io.dynamiccl.base=${name}-${key}" "$c"
  bh commit -q "$c" "${ref}" >/dev/null
  bh rm "$c" >/dev/null
  info "done   base ${name} in $((SECONDS - t0))s (${ref})"
}

for b in "${BASES[@]}"; do make_base "$b"; done

# A clean build context: exactly the hashed files.
CTX="$(mktemp -d "${IMG_DIR}/.ctx-XXXXXX")"
trap 'rm -rf "${CTX}" "${CTX}.ca"' EXIT
(cd "${REPO_ROOT}" && context_files | tar --null -T - -cf -) | tar -C "${CTX}" -xf -

# HTTPS from inside the build (PyPI) must trust this machine's CA bundle
# (registries may be reached through a proxy of its own). The bundle is
# mounted beside the image's /etc/ssl/certs, not over it (a RUN step that
# installs ca-certificates writes there), and pip is pointed at it.
HOST_CA=""
for f in "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  [[ -n "$f" && -s "$f" ]] && { HOST_CA="$f"; break; }
done
[[ -n "${HOST_CA}" ]] || die "no CA bundle found on this machine (set SSL_CERT_FILE)"
mkdir -p "${CTX}.ca"
cp -f "${HOST_CA}" "${CTX}.ca/ca-certificates.crt"
printf '[global]\ncert = /run/dynamiccl-build-ca/ca-certificates.crt\n' >"${CTX}.ca/pip.conf"
vols=(--volume "${CTX}.ca:/run/dynamiccl-build-ca:ro" --volume "${CTX}.ca/pip.conf:/etc/pip.conf:ro")
build_args=(--build-arg "DEBIAN_BASE=${BASE_REF[debian]}" --build-arg "PYTHON_BASE=${BASE_REF[python]}"
            --build-arg "RUNTIME_BASE=${BASE_REF[python-run]}"
            --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL}")
LOG_DIR="${DYNAMICCL_CACHE}/logs/images"
mkdir -p "${LOG_DIR}"

build_target() { # TARGET REF ARCHIVE [push options]
  local target="$1" ref="$2" archive="$3" log="${LOG_DIR}/$1.log" t0=${SECONDS}
  shift 3
  info "build  ${target} -> ${ref} (log: ${log})"
  if ! bh bud --pull-never --layers --network host "${vols[@]}" "${build_args[@]}" \
        --target "${target}" -t "${ref}" -f "${CTX}/Dockerfile" "${CTX}" >"${log}" 2>&1; then
    tail -n 25 "${log}" >&2
    die "buildah bud --target ${target} failed; see ${log}"
  fi
  rm -f "${archive}.tmp"
  bh push -q "$@" "${ref}" "oci-archive:${archive}.tmp:${ref}" >>"${log}" 2>&1 ||
    die "buildah push ${ref} to an OCI archive failed; see ${log}"
  mv -f "${archive}.tmp" "${archive}"
  info "done   ${target} in $((SECONDS - t0))s ($(du -m "${archive}" | cut -f1) MB archive)"
}

build_target runtime "${RUNTIME_REF}" "${RUNTIME_TAR}"
# zstd for the trainer: gzip of its ~2 GB (torch) takes minutes on 2 cores
build_target trainer "${TRAINER_REF}" "${TRAINER_TAR}" --compression-format zstd

# Uncompressed size (what the image takes unpacked on a node) from the store.
image_size() { # unpacked size, as buildah prints it ("534 MB")
  bh images --noheading --format '{{.Size}}' "$1" 2>/dev/null | head -1
}
cat >"${KEY_ENV}" <<EOF
# Written by hack/images.sh; shell-sourceable.
DYNAMICCL_IMAGE_KEY=${KEY}
DYNAMICCL_IMAGE_REPOSITORY=${IMAGE_REPO}
DYNAMICCL_IMAGE_TAG=${KEY}
DYNAMICCL_IMAGE=${RUNTIME_REF}
DYNAMICCL_IMAGE_TRAIN=${TRAINER_REF}
DYNAMICCL_IMAGE_ARCHIVE=${RUNTIME_TAR}
DYNAMICCL_IMAGE_TRAIN_ARCHIVE=${TRAINER_TAR}
DYNAMICCL_IMAGE_SIZE="$(image_size "${RUNTIME_REF}")"
DYNAMICCL_IMAGE_TRAIN_SIZE="$(image_size "${TRAINER_REF}")"
DYNAMICCL_IMAGE_ARCHIVE_MB=$(du -m "${RUNTIME_TAR}" | cut -f1)
DYNAMICCL_IMAGE_TRAIN_ARCHIVE_MB=$(du -m "${TRAINER_TAR}" | cut -f1)
EOF

# Keep only this key's archives and tagged images.
for f in "${IMG_DIR}"/dynamiccl-*; do
  case "$f" in "${IMG_DIR}/dynamiccl-${KEY}"*) ;; *) rm -f "$f" ;; esac
done
bh images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep "^${IMAGE_REPO}:" |
  grep -v -e "^${RUNTIME_REF}\$" -e "^${TRAINER_REF}\$" | xargs -r -n1 buildah --root "${STORE}/${DRIVER}" \
  --runroot "${STORE}/run-${DRIVER}" --storage-driver "${DRIVER}" rmi -f >/dev/null 2>&1 || true
# (untagged intermediate images stay: they are the --layers cache, e.g. torch)

info "images ready in $((SECONDS - START))s: ${RUNTIME_REF} ($(image_size "${RUNTIME_REF}") unpacked), ${TRAINER_REF} ($(image_size "${TRAINER_REF}") unpacked)"
finish

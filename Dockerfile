# Two images from one build:
#   docker build -t dynamiccl:dev .                              (default target: runtime)
#   docker build --target trainer -t dynamiccl:dev-train .       (the retraining Job's)
# runtime: the operator, the injected sidecar agent and the node agent — no torch
#   (the sidecar image is pulled onto every training node; it stays small).
# trainer: runtime + CPU torch, for `dynamiccl train` (the chart's learning.image
#   defaults to the runtime image's tag with "-train" appended). From PyPI's CUDA
#   torch the CUDA libraries are replaced by stubs (hack/torch_cpu_stubs.py).
# Entry point is the `dynamiccl` CLI: `dynamiccl operator`, `dynamiccl sidecar`,
# `dynamiccl node-agent`, `dynamiccl train`. The NCCL tuner/profiler plugin is at
# /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so; the webhook's init step copies
# it into the training pod.
#
# Base images are build arguments: the defaults are the public Debian and Python
# images; `make images` (hack/images.sh) builds both targets without a registry
# from Debian-package bases of its own (same Debian release, python3 3.11; the
# runtime's has no apt and no pip: what the build stages need stays in them).
# Python packages go into a virtualenv at /opt/dynamiccl/venv, which works on
# both kinds of base (Debian's own python3 is "externally managed"). The venv
# links to its base's python3: RUNTIME_BASE must have the same Python at the
# same path as PYTHON_BASE (the default: the same image).
# TORCH_INDEX_URL: an extra pip index for torch (default: PyPI's CPU-only
# mirror at pytorch.org); empty = PyPI alone, whose Linux x86_64 torch is the
# CUDA build (several GB of nvidia-* wheels).
ARG DEBIAN_BASE=debian:bookworm-slim
ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG RUNTIME_BASE=python:3.11-slim-bookworm

# --- build the plugin (C, no CUDA needed; no NCCL header is vendored: plugin/include declares
#     the ABI from the facts of NCCL's public headers). Both architectures, each against
#     glibc 2.17 (zig cc from PyPI, plugin/cross/): /dist/{x86_64,aarch64}/, and this
#     platform's at /libnccl-tuner-dynamiccl.so (an emulated multi-platform build
#     runs this stage as the target platform) ---
FROM ${DEBIAN_BASE} AS plugin
RUN apt-get update \
 && apt-get install -y --no-install-recommends make python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY plugin/ plugin/
RUN make -C plugin dist && cp -r plugin/build/dist /dist \
 && cp /dist/$(uname -m)/libnccl-tuner-dynamiccl.so /libnccl-tuner-dynamiccl.so

# --- build a wheel of the Python package ---------------------------------------
FROM ${PYTHON_BASE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dynamiccl/ dynamiccl/
COPY operator/ operator/
COPY policy/ policy/
COPY sidecar/ sidecar/
COPY node_agent/ node_agent/
RUN python3 -m venv /tmp/build-venv \
 && /tmp/build-venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- the package's dependencies, from pyproject.toml alone (a layer cached until that file
#     changes: a source change rebuilds only the wheel and the last layers, not ~150 MB of
#     downloads from PyPI). Core dependencies only: no torch (`train` extra), no matplotlib
#     (`plots` extra). hack/slim_venv.py then drops test suites, the unused kubernetes.aio and
#     debug sections of extension modules; setuptools goes (nothing imports it at run time) ---
FROM ${PYTHON_BASE} AS deps
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PATH=/opt/dynamiccl/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies']))" >/tmp/requirements.txt \
 && python3 -m venv /opt/dynamiccl/venv && pip install -r /tmp/requirements.txt
COPY hack/slim_venv.py /tmp/slim_venv.py
RUN pip uninstall -y -q setuptools \
 && python3 /tmp/slim_venv.py "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# --- the package itself, installed on the dependencies (pip check fails the build if one is
#     missing); its files alone go to /stage, the runtime's last Python layer ---
FROM deps AS app
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && pip check \
 && sp="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && mkdir /stage && cp -a --parents "$sp"/dynamiccl "$sp"/dynamiccl-*.dist-info \
    /opt/dynamiccl/venv/bin/dynamiccl /stage/

# --- the runtime's venv: the dependencies without pip (nothing installs at run time) ---
FROM deps AS venv
RUN pip uninstall -y -q pip

# --- torch for the trainer, in its own stage (cached: a code change rebuilds only the
#     trainer's last layers). PyPI's Linux x86_64 torch is the CUDA build (~5 GB with its
#     nvidia-* wheels); hack/torch_cpu_stubs.py turns it into a CPU torch (site-packages
#     5.6 GB -> 1.5 GB):
#     the CUDA libraries torch links against become stubs of the same sonames and symbols
#     (libcudart and libcupti stay real: with no GPU they answer "no device"), the ones
#     nothing links against and triton go. With the CPU index torch has no CUDA and the
#     script leaves it alone.
FROM ${PYTHON_BASE} AS torch
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/dynamiccl/venv/bin:$PATH
RUN python3 -m venv /opt/dynamiccl/venv \
 && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch>=2.3"
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc binutils libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY hack/torch_cpu_stubs.py /tmp/torch_cpu_stubs.py
RUN python3 /tmp/torch_cpu_stubs.py "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# the package's dependencies after torch (torch's layers stay cached when pyproject.toml changes)
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['plots']))" >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt

# --- trainer: the runtime's package with the training and plots extras (CPU torch) -----
FROM ${PYTHON_BASE} AS trainer
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/dynamiccl/venv/bin:$PATH
COPY --from=torch /opt/dynamiccl/venv /opt/dynamiccl/venv
COPY --from=wheel /wheels /wheels
# torch must import and train a step on the CPU (the stubs must never be called there)
# dependencies come from the torch stage; pip check fails the build if one is missing
RUN pip install --no-deps /wheels/dynamiccl-*.whl && pip check && rm -rf /wheels \
 && python3 -c "import torch; m = torch.nn.Linear(4, 2); m(torch.randn(8, 4)).sum().backward(); \
assert not torch.cuda.is_available(); print('torch', torch.__version__, 'CPU ok')"
RUN echo 'dynamiccl:x:65532:65532:dynamiccl:/nonexistent:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'dynamiccl:x:65532:' >>/etc/group
USER 65532:65532
ENTRYPOINT ["dynamiccl"]
CMD ["train", "--help"]

# --- runtime (default target) -------------------------------------------------------
FROM ${RUNTIME_BASE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/dynamiccl/venv/bin:$PATH
# the dependencies (a layer that changes only with pyproject.toml), then the package
COPY --from=venv /opt/dynamiccl/venv /opt/dynamiccl/venv
COPY --from=app /stage/ /
# Every shared object finds its libraries on this base, and every module of the
# operator, sidecar, node agent and CLI imports (no torch, no matplotlib here).
# A user name for the default uid (65532): libraries asking for it (getpass.getuser(),
# kopf's peering identity) fail on a uid without a passwd entry. Neither public base
# nor the Debian one has it.
RUN ! find /opt/dynamiccl/venv -name '*.so*' -type f -exec ldd {} + 2>&1 | grep 'not found' \
 && python3 -c "import importlib, pkgutil, dynamiccl.cli; \
[importlib.import_module(m.name) for p in ('operator', 'sidecar', 'node_agent', 'api') \
 for m in pkgutil.walk_packages(importlib.import_module('dynamiccl.' + p).__path__, \
 'dynamiccl.' + p + '.')]" \
 && echo 'dynamiccl:x:65532:65532:dynamiccl:/nonexistent:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'dynamiccl:x:65532:' >>/etc/group
COPY --from=plugin /libnccl-tuner-dynamiccl.so /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so
RUN chmod 0755 /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so
COPY --from=plugin /dist/ /opt/dynamiccl/lib/dist/
# Non-root (the chart and the injected containers also set runAsUser 65532,
# readOnlyRootFilesystem and drop every capability).
USER 65532:65532
ENTRYPOINT ["dynamiccl"]
CMD ["--help"]

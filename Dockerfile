# Two images from one build:
#   docker build -t dynamiccl:dev .                              (default target: runtime)
#   docker build --target trainer -t dynamiccl:dev-train .       (the retraining Job's)
# runtime: the operator, the injected sidecar agent and the node agent — no torch
#   (the sidecar image is pulled onto every training node; it stays small).
# trainer: runtime + CPU torch, for `dynamiccl train` (the chart's learning.image
#   defaults to the runtime image's tag with "-train" appended).
# Entry point is the `dynamiccl` CLI: `dynamiccl operator`, `dynamiccl agent`,
# `dynamiccl node-agent`, `dynamiccl train`. The NCCL tuner/profiler plugin is at
# /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so; the webhook's init step copies
# it into the training pod.

# --- build the plugin (C, no CUDA needed; no NCCL header is vendored: plugin/include declares
#     the ABI from the facts of NCCL's public headers). Both architectures, each against
#     glibc 2.17 (zig cc from PyPI, plugin/cross/): /dist/{x86_64,aarch64}/, and this
#     platform's at /libnccl-tuner-dynamiccl.so (an emulated multi-platform build
#     runs this stage as the target platform) ---
FROM debian:bookworm-slim AS plugin
RUN apt-get update \
 && apt-get install -y --no-install-recommends make python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY plugin/ plugin/
RUN make -C plugin dist && cp -r plugin/build/dist /dist \
 && cp /dist/$(uname -m)/libnccl-tuner-dynamiccl.so /libnccl-tuner-dynamiccl.so

# --- build a wheel of the Python package ---------------------------------------
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dynamiccl/ dynamiccl/
COPY operator/ operator/
COPY policy/ policy/
COPY agent/ agent/
COPY node_agent/ node_agent/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- trainer: the runtime's package with the training extra (CPU torch) -----------
FROM python:3.11-slim-bookworm AS trainer
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=wheel /wheels /wheels
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu \
      "$(ls /wheels/dynamiccl-*.whl)[train]" && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["dynamiccl"]
CMD ["train", "--help"]

# --- runtime (default target) -------------------------------------------------------
FROM python:3.11-slim-bookworm AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
COPY --from=plugin /libnccl-tuner-dynamiccl.so /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so
RUN chmod 0755 /opt/dynamiccl/lib/libnccl-tuner-dynamiccl.so
COPY --from=plugin /dist/ /opt/dynamiccl/lib/dist/
# Non-root (the chart and the injected containers also set runAsUser 65532,
# readOnlyRootFilesystem and drop every capability).
USER 65532:65532
ENTRYPOINT ["dynamiccl"]
CMD ["--help"]

"""Every label, annotation key and environment variable name DynamICCL uses.

One module so that a grep finds every contract with the outside world.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "dynamiccl.io"
API_VERSION: Final = "v1alpha1"

# --- job / pod annotations (set by users) ---------------------------------
ANNOTATION_TUNE: Final = f"{GROUP}/tune"
ANNOTATION_PARALLELISM: Final = f"{GROUP}/parallelism"
ANNOTATION_MODEL_SIZE: Final = f"{GROUP}/model-size"
ANNOTATION_SYNC_MODE: Final = f"{GROUP}/sync-mode"
ANNOTATION_COMPRESSION: Final = f"{GROUP}/compression"
ANNOTATION_POLICY: Final = f"{GROUP}/policy"

# --- annotations / labels written by DynamICCL ----------------------------
ANNOTATION_INJECTED: Final = f"{GROUP}/injected"
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_JOB_KIND: Final = f"{GROUP}/job-kind"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_NAMESPACE_TUNE: Final = f"{GROUP}/tune"

# --- node labels published by the node agent ------------------------------
NODE_LABEL_NVLINK: Final = f"{GROUP}/nvlink"
NODE_LABEL_NVSWITCH: Final = f"{GROUP}/nvswitch"
NODE_LABEL_NVLS: Final = f"{GROUP}/nvls"
NODE_LABEL_FABRIC: Final = f"{GROUP}/fabric"
NODE_LABEL_NIC_GBPS: Final = f"{GROUP}/nic-gbps"
NODE_LABEL_SHARP: Final = f"{GROUP}/sharp"
NODE_LABEL_GPU_PRODUCT: Final = f"{GROUP}/gpu-product"

# --- NCCL environment variables -------------------------------------------
ENV_NCCL_TUNER_PLUGIN: Final = "NCCL_TUNER_PLUGIN"
ENV_NCCL_PROFILER_PLUGIN: Final = "NCCL_PROFILER_PLUGIN"
ENV_NCCL_ALGO: Final = "NCCL_ALGO"
ENV_NCCL_PROTO: Final = "NCCL_PROTO"
ENV_NCCL_NTHREADS: Final = "NCCL_NTHREADS"
ENV_NCCL_BUFFSIZE: Final = "NCCL_BUFFSIZE"
ENV_NCCL_TOPO_FILE: Final = "NCCL_TOPO_FILE"

# --- DynamICCL's own environment variables --------------------------------
ENV_SHM_PATH: Final = "DYNAMICCL_SHM_PATH"
ENV_JOB_ID: Final = "DYNAMICCL_JOB_ID"
ENV_HOST_ROOT: Final = "DYNAMICCL_HOST_ROOT"
ENV_CACHE: Final = "DYNAMICCL_CACHE"
ENV_KUBECONFIG: Final = "KUBECONFIG"

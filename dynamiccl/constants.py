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

# --- operator (issue #4): more user annotations ----------------------------
ANNOTATION_CCL: Final = f"{GROUP}/ccl"  # nccl (default) | rccl | gloo | mpi | other
ANNOTATION_C2C_RATIO: Final = f"{GROUP}/c2c-ratio"  # compute / communication time
ANNOTATION_INA: Final = f"{GROUP}/in-network-aggregation"  # "true" → passthrough

# --- operator: annotations / labels written on pods and our objects --------
ANNOTATION_USER_NCCL_ENV: Final = f"{GROUP}/user-nccl-env"  # user NCCL_* kept (JSON)
ANNOTATION_CONFIG_DIGEST: Final = f"{GROUP}/config-digest"
ANNOTATION_JOB_KIND: Final = f"{GROUP}/job-kind"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"  # the chart's release
CHART_SELECTOR: Final = "app.kubernetes.io/name=dynamiccl"  # every object of the chart
MANAGED_BY: Final = "dynamiccl"

# --- labels other controllers put on training pods ------------------------
LABEL_KUBEFLOW_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_KUBEFLOW_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_KUBEFLOW_JOB_ROLE: Final = "training.kubeflow.org/job-role"
LABEL_JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
LABEL_TRAINJOB_NAME: Final = "trainer.kubeflow.org/trainjob-name"

# --- node labels published by others (topograph, GFD, NFD, well-known) -----
NODE_LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
NODE_LABEL_ZONE: Final = "topology.kubernetes.io/zone"
NODE_LABEL_TOPO_ACCELERATOR: Final = "network.topology.nvidia.com/accelerator"
NODE_LABEL_TOPO_LEAF: Final = "network.topology.nvidia.com/leaf"
NODE_LABEL_TOPO_SPINE: Final = "network.topology.nvidia.com/spine"
NODE_LABEL_TOPO_CORE: Final = "network.topology.nvidia.com/core"
NODE_LABEL_GFD_PRODUCT: Final = "nvidia.com/gpu.product"
NODE_LABEL_GFD_COUNT: Final = "nvidia.com/gpu.count"
NODE_LABEL_NFD_RDMA: Final = "feature.node.kubernetes.io/rdma.available"
RESOURCE_GPU: Final = "nvidia.com/gpu"

# --- injected into training pods -------------------------------------------
ENV_NCCL_MIN_NCHANNELS: Final = "NCCL_MIN_NCHANNELS"
ENV_NCCL_MAX_NCHANNELS: Final = "NCCL_MAX_NCHANNELS"
ENV_CONFIG_DIR: Final = "DYNAMICCL_CONFIG_DIR"  # where the job's ConfigMap is mounted
ENV_POD_NAME: Final = "DYNAMICCL_POD_NAME"
ENV_POD_NAMESPACE: Final = "DYNAMICCL_POD_NAMESPACE"
ENV_AGENT_NODE_NAME: Final = "DYNAMICCL_NODE_NAME"
PLUGIN_LIBRARY: Final = "libnccl-tuner-dynamiccl.so"

# --- reward ingest (operator endpoint; the sidecar reports through it) -------
INGEST_AUDIENCE: Final = "dynamiccl-ingest"  # audience of the projected SA token
INGEST_PATH: Final = "/v1/rewards"
TOKENREVIEW_EXTRA_POD_NAME: Final = "authentication.kubernetes.io/pod-name"
TOKENREVIEW_EXTRA_POD_UID: Final = "authentication.kubernetes.io/pod-uid"
ENV_INGEST_URL: Final = "DYNAMICCL_INGEST_URL"  # https://<operator service>:<port>/v1/rewards
ENV_INGEST_TOKEN_FILE: Final = "DYNAMICCL_INGEST_TOKEN_FILE"  # projected token path
ENV_INGEST_CA_FILE: Final = "DYNAMICCL_INGEST_CA_FILE"  # CA bundle of the ingest cert
ENV_STORE_URL: Final = "DYNAMICCL_STORE_URL"  # experience store (sqlite path / postgresql://)

# --- node agent (issue #3) --------------------------------------------------
NODE_LABEL_NVLINK_CLIQUE: Final = f"{GROUP}/nvlink-clique"  # <clusterUuid>.<cliqueId> (NVL72)
NODE_LABEL_SHARP_OVERRIDE: Final = f"{GROUP}/sharp-override"  # set by admins: "true"/"false"
ENV_NODE_NAME: Final = "NODE_NAME"  # downward API spec.nodeName in the DaemonSet
NCCL_TOPO_FILE_HOST_PATH: Final = "/var/lib/dynamiccl/nccl-topo.xml"  # written by the node agent
# Topology files in a job's ConfigMap (docs/admin-guide.md, 'Topology files'): one key per
# distinct file, and which node has which (an init step copies the pod's node's file).
# binaryData: gzip of {"<node>": "<file key>"} (dynamiccl/api/topo_nodes.py)
TOPO_FILE_NODES_KEY: Final = "nccl-topo-nodes.json.gz"
TOPO_FILE_KEY_PREFIX: Final = "nccl-topo-"  # + 16 hex digits of the file's sha256 + ".xml"

# --- NCCL plugin (issue #5) -------------------------------------------------
ENV_PLUGIN_SO: Final = "DYNAMICCL_PLUGIN_SO"  # test/bench override of the plugin .so path

# --- sidecar (issue #7) -------------------------------------------------------
ENV_POD_UID: Final = "DYNAMICCL_POD_UID"  # downward API metadata.uid (idempotency keys)
ENV_EPOCH_INTERVAL: Final = "DYNAMICCL_EPOCH_INTERVAL"  # L of the shm file (power of two)
ENV_VOTERS: Final = "DYNAMICCL_VOTERS"  # sidecars of the job (default: features.replicas)
ENV_PROCS_PER_POD: Final = "DYNAMICCL_PROCS_PER_POD"  # default: features.nproc_per_node
ENV_COORDINATION: Final = "DYNAMICCL_COORDINATION"  # kube | file:<dir> | none
ENV_AGENT_METRICS_PORT: Final = "DYNAMICCL_AGENT_METRICS_PORT"  # 0 = no /metrics
SHM_FILE_NAME: Final = "dynamiccl.shm"  # the plugin's file inside the shm emptyDir

# --- demo (issue #8) -----------------------------------------------------------
LABEL_DEMO_RELEASE: Final = "demo.dynamiccl.io/release"  # namespaces `make demo-cluster` owns

# --- step time judges a change (issue 31): the sidecar's step judge and the learning loop ---
STEP_MIN_STEPS: Final = 8  # steps of a table version before it is compared
STEP_MARGIN: Final = 0.01  # a change slower by less than this share of the step is kept
STEP_Z: Final = 3.0  # standard errors of the difference a slowdown must exceed
STEP_WINDOW: Final = 256  # step times a sidecar keeps per table version (its median's window)

"""The demo-cluster's objects, built without a cluster: helm values, the operator's
arguments from the chart's manifest, the demo's policy and jobs
(`dynamiccl.demo.kube_driver` applies them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

from dynamiccl import constants as c
from dynamiccl.testing.local_job import EXAMPLES, JOB

RELEASE: Final = "dynamiccl-demo"
SYSTEM_NS: Final = "dynamiccl-demo-system"
NAMESPACE: Final = "dynamiccl-demo"
POLICY: Final = "dynamiccl-demo-learned"
GPU_PRODUCT: Final = "NVIDIA-H100-80GB-HBM3"
# The sequence's hardware class: 4 DGX A100 nodes (no NVLink SHARP, so NCCL runs Ring for large
# all-reduce there, where the demo's surface makes Tree faster; on the H100 nodes NCCL's own
# pick is NVLS tree).
SEQUENCE_GPU_PRODUCT: Final = "NVIDIA-A100-SXM4-80GB"
CHART: Final = Path(__file__).resolve().parents[2] / "charts" / "dynamiccl"


def chart_values(webhook_port: int, store_url: str = "") -> dict[str, Any]:
    """Helm values: the webhook is the local process; only the demo's namespace is mutated;
    `store_url` (no password): the experience store, e.g. a PostgreSQL server."""
    values: dict[str, Any] = {
        "webhook": {
            "url": f"https://127.0.0.1:{webhook_port}/mutate",
            "namespaceSelectorExpressions": [
                {"key": c.LABEL_DEMO_RELEASE, "operator": "In", "values": [RELEASE]}
            ],
        },
        "nodeAgent": {"enabled": False},  # kwok nodes have no sysfs; their labels describe them
    }
    if store_url:
        values["store"] = {"url": store_url}
    return values


def _deployment_args(manifest: str, suffix: str) -> list[str]:
    for doc in yaml.safe_load_all(manifest):
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "Deployment"
            and doc["metadata"]["name"].endswith(suffix)
        ):
            return [
                str(a) for a in doc["spec"]["template"]["spec"]["containers"][0].get("args") or []
            ]
    raise RuntimeError(f"the chart rendered no {suffix.strip('-')} Deployment")


def operator_args(
    manifest: str, port: int, metrics_port: int, kubeconfig: str, model_token: Path | None = None
) -> list[str]:
    """The chart's operator arguments, adapted to a process on this machine (`model_token`:
    the file holding its ServiceAccount's token for the ingest, as the chart projects it)."""
    local = ("--webhook-port=", "--metrics-port=", "--webhook-host=", "--model-token-file=")
    args = [a for a in _deployment_args(manifest, "-operator") if not a.startswith(local)]
    args += [
        f"--webhook-port={port}",
        f"--metrics-port={metrics_port}",
        "--webhook-host=127.0.0.1",
        "--extra-san=127.0.0.1",
        f"--kubeconfig={kubeconfig}",
    ]
    return [*args, f"--model-token-file={model_token}"] if model_token else args


def ingest_args(manifest: str, port: int, tls: Path, kubeconfig: str, volume: Path) -> list[str]:
    """The chart's ingest (and learning loop) arguments, adapted to a process on this machine:
    its port and certificate files here, the store's volume a local directory `volume`
    (the retraining Job's spec then names that path), a loop tick every 2 s."""
    local = ("--port=", "--tls-cert=", "--tls-key=", "--loop-interval=", "--loop-mount-path=")
    args = [a for a in _deployment_args(manifest, "-ingest") if not a.startswith(local)]
    return [
        *args,
        "--host=127.0.0.1",
        f"--port={port}",
        f"--tls-cert={tls / 'tls.crt'}",
        f"--tls-key={tls / 'tls.key'}",
        f"--kubeconfig={kubeconfig}",
        f"--loop-mount-path={volume}",
        "--loop-interval=2",
    ]


def demo_policy() -> dict[str, Any]:
    """The sample `ml-learned`, renamed and selecting only the demo's namespace."""
    doc: dict[str, Any] = yaml.safe_load(
        (EXAMPLES / "policies" / "learned-canary.yaml").read_text()
    )
    doc["metadata"] = {"name": POLICY}
    spec = doc["spec"]
    spec["selector"]["namespaceSelector"] = {
        "matchLabels": {"team": "ml", c.LABEL_DEMO_RELEASE: RELEASE}
    }
    spec["model"] = {"version": "default"}  # the shipped model; no canary before retraining
    # The learning loop follows the primary (highest-priority learned) policy: make it this one,
    # and never due for retraining (kwok cannot run the retraining Job's container).
    spec["priority"] = 1000
    spec["retraining"] = {"minNewExperience": 1_000_000_000}
    return doc


def job_manifest() -> dict[str, Any]:
    """`examples/pytorchjob.yaml` in the demo's namespace, on the cluster's H100 nodes, naming
    the demo's policy."""
    doc: dict[str, Any] = yaml.safe_load(JOB.read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    # The cluster is shared: name the demo's policy so another one cannot win the selection.
    doc["metadata"]["annotations"][c.ANNOTATION_POLICY] = POLICY
    for group in doc["spec"]["pytorchReplicaSpecs"].values():
        group["template"]["spec"]["nodeSelector"] = {c.NODE_LABEL_GFD_PRODUCT: GPU_PRODUCT}
    return doc


def learning_policy(canary_percent: int, budget_percent: float) -> dict[str, Any]:
    """The demo's policy for a sequence of jobs: the learning loop follows it (highest priority),
    retrains once new experience arrived, gives a new version to `canary_percent` % of jobs;
    each job explores within `budget_percent` % of its collective time (as in
    dynamiccl/demo/sequence.py, whose spec it carries)."""
    doc = demo_policy()
    spec = doc["spec"]
    for key in ("constraints", "guardrails"):
        spec.pop(key, None)
    spec["exploration"] = {"budgetPercent": budget_percent}
    spec["retraining"] = {"minNewExperience": 1, "canaryPercent": canary_percent}
    return doc


def sequence_job(index: int, workers: int = 3) -> dict[str, Any]:
    """Job `index` of the sequence: the example PyTorchJob, 1 master + `workers` pods of 8 GPUs
    on the A100 nodes (one data-parallel communicator over all ranks), suspended until its
    ConfigMap exists."""
    doc = job_manifest()
    for group in doc["spec"]["pytorchReplicaSpecs"].values():
        group["template"]["spec"]["nodeSelector"] = {c.NODE_LABEL_GFD_PRODUCT: SEQUENCE_GPU_PRODUCT}
    doc["metadata"]["name"] = f"train-{index:02d}"
    ranks = 8 * (1 + workers)
    doc["metadata"]["annotations"][c.ANNOTATION_PARALLELISM] = f"fsdp:dp={ranks}"
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = workers
    doc["spec"]["runPolicy"] = {"suspend": True}
    return doc

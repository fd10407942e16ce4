"""The demo-cluster's objects, built without a cluster: helm values, the operator's
arguments from the chart's manifest, the demo's policy and job, the pods' rank
layout and the sidecar's command (`dynamiccl.demo.kube` applies and runs them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from dynamiccl import constants as c
from dynamiccl.demo.cluster import PodPlan
from dynamiccl.demo.kubelet import Volumes
from dynamiccl.demo.pipeline import EXAMPLES, JOB

RELEASE: Final = "dynamiccl-demo"
SYSTEM_NS: Final = "dynamiccl-demo-system"
NAMESPACE: Final = "dynamiccl-demo"
POLICY: Final = "dynamiccl-demo-learned"
GPU_PRODUCT: Final = "NVIDIA-H100-80GB-HBM3"
CHART: Final = Path(__file__).resolve().parents[2] / "charts" / "dynamiccl"


def chart_values(webhook_port: int) -> dict[str, Any]:
    """Helm values: the webhook is the local process; only the demo's namespace is mutated."""
    return {
        "webhook": {
            "url": f"https://127.0.0.1:{webhook_port}/mutate",
            "namespaceSelectorExpressions": [
                {"key": c.LABEL_DEMO_RELEASE, "operator": "In", "values": [RELEASE]}
            ],
        },
        "nodeAgent": {"enabled": False},  # kwok nodes have no sysfs; their labels describe them
    }


def operator_args(manifest: str, port: int, metrics_port: int, kubeconfig: str) -> list[str]:
    """The chart's operator arguments, adapted to a process on this machine."""
    local = ("--webhook-port=", "--metrics-port=", "--webhook-host=")
    for doc in yaml.safe_load_all(manifest):
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "Deployment"
            and doc["metadata"]["name"].endswith("-operator")
        ):
            args = doc["spec"]["template"]["spec"]["containers"][0].get("args") or []
            return [
                *(str(a) for a in args if not str(a).startswith(local)),
                f"--webhook-port={port}",
                f"--metrics-port={metrics_port}",
                "--webhook-host=127.0.0.1",
                "--extra-san=127.0.0.1",
                f"--kubeconfig={kubeconfig}",
            ]
    raise RuntimeError("the chart rendered no operator Deployment")


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


def plans(pods: Sequence[Mapping[str, Any]], nproc: int) -> list[PodPlan]:
    """Rank layout of the job's pods: Master first, then Workers by index."""

    def key(p: Mapping[str, Any]) -> tuple[int, int]:
        labels = p["metadata"].get("labels") or {}
        role = str(labels.get(c.LABEL_KUBEFLOW_REPLICA_TYPE, "")).lower()
        return (
            0 if role == "master" else 1,
            int(labels.get("training.kubeflow.org/replica-index", 0)),
        )

    out = []
    for k, p in enumerate(sorted(pods, key=key)):
        labels = p["metadata"].get("labels") or {}
        out.append(
            PodPlan(
                name=p["metadata"]["name"],
                uid=p["metadata"]["uid"],
                role=str(labels.get(c.LABEL_KUBEFLOW_REPLICA_TYPE, "")),
                index=int(labels.get("training.kubeflow.org/replica-index", 0)),
                node=str(p["spec"].get("nodeName", "")),
                first_rank=k * nproc,
                nproc=nproc,
            )
        )
    return out


def sidecar_command(
    kubeconfig: str, ca_file: Path
) -> Callable[..., tuple[list[str], dict[str, str]]]:
    """The injected `dynamiccl agent`, run here: epoch record through the apiserver."""

    def command(
        pod: Mapping[str, Any], vols: Volumes, pdir: Path
    ) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "dynamiccl.cli", "agent", "--coordination", "kube"]
        argv += ["--kubeconfig", kubeconfig, "--ca-file", str(ca_file), "--metrics-port", "0"]
        argv += ["--json", "--epoch-interval", "64", "--min-proposal-interval", "8"]
        argv += ["--flush-interval", "1", "--send-grace", "30"]
        return argv, {}

    return command

"""The objects benchmarks/operator_scale_bench.py creates on its private cluster, and how it
waits for the operator's answers.

Nodes labelled as GPU Feature Discovery, topograph and the zone would label them (4
hardware kinds, 32 nodes per leaf switch, 500 per zone), cordoned and tainted so nothing
is scheduled there; annotated PyTorchJobs (Master + Worker, 8 GPUs each), suspended; their
pods, bound to two of those nodes by ``spec.nodeName`` as the scheduler would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing import builders

REPO = Path(__file__).resolve().parents[1]
NTP = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
PT = ("kubeflow.org", "v1", "pytorchjobs")
TR = ("dynamiccl.io", "v1alpha1", "tuningruns")
TAINT = "bench.dynamiccl.io/scale"  # keeps every real pod off the bench nodes
KINDS = [  # (product, family, fabric leaf prefix, NVSwitch)
    ("NVIDIA-H100-80GB-HBM3", "hopper", "ib", True),
    ("NVIDIA-A100-SXM4-80GB", "ampere", "ib", True),
    ("NVIDIA-H200", "hopper", "ib", True),
    ("NVIDIA-L40S", "ada-lovelace", "eth", False),
]


def node(i: int) -> dict[str, Any]:
    product, family, fabric, nvswitch = KINDS[(i // 128) % len(KINDS)]
    name = f"scale-{i:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        c.NODE_LABEL_GFD_PRODUCT: product,
        "nvidia.com/gpu.family": family,
        c.NODE_LABEL_GFD_COUNT: "8",
        "nvidia.com/gpu.present": "true",
        c.NODE_LABEL_ZONE: f"scale-zone-{i // 500}",
        c.NODE_LABEL_TOPO_LEAF: f"{fabric}-leaf-{i // 32:03d}",
        c.NODE_LABEL_TOPO_SPINE: f"{fabric}-spine-{i // 256:02d}",
    }
    if nvswitch:
        labels[c.NODE_LABEL_TOPO_ACCELERATOR] = f"nvl-{name}"
    if fabric == "ib":
        labels[c.NODE_LABEL_NFD_RDMA] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True, "taints": [{"key": TAINT, "effect": "NoSchedule"}]},
    }


def job(i: int) -> dict[str, Any]:
    return builders.pytorchjob(
        f"job-{i:04d}",
        annotations={c.ANNOTATION_TUNE: "true", c.ANNOTATION_PARALLELISM: "fsdp"},
        nproc_per_node="8",
        suspend=True,
    )


def pod(job: dict[str, Any], role: str, node: str) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "metadata": {
            "name": f"{name}-{role}-0",
            "labels": {c.LABEL_KUBEFLOW_JOB_NAME: name, c.LABEL_KUBEFLOW_REPLICA_TYPE: role},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],  # no eviction from NotReady nodes
            "containers": [{"name": "pytorch", "image": "example.invalid/train:1"}],
        },
    }


def parallel(items: Iterable[Any], fn: Callable[[Any], Any], rate: float) -> list[Any]:
    """``fn(item)`` for every item, started at ``rate``/s on a pool of 16 threads."""
    with ThreadPoolExecutor(16) as pool:
        futures = []
        t0 = time.monotonic()
        for k, item in enumerate(items):
            delay = t0 + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(fn, item))
        return [f.result() for f in futures]


class ConfigMapsSeen:
    """First time a watch saw each ConfigMap of a namespace (monotonic clock)."""

    def __init__(self, core: k8s.CoreV1Api, ns: str) -> None:
        self.at: dict[str, float] = {}
        self._w = k8s_watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated
        threading.Thread(target=self._run, args=(core, ns), daemon=True).start()

    def _run(self, core: k8s.CoreV1Api, ns: str) -> None:
        try:
            for ev in self._w.stream(core.list_namespaced_config_map, ns, timeout_seconds=7200):  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated
                self.at.setdefault(ev["object"].metadata.name, time.monotonic())
        except Exception:
            return

    def stop(self) -> None:
        self._w.stop()  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated


def ensure_crds(ext: k8s.ApiextensionsV1Api) -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except ApiException as exc:
            if exc.status != 409:
                raise
    time.sleep(3)  # served


def wait(what: str, fn: Callable[[], bool], timeout: float) -> float:
    t0 = time.monotonic()
    while not fn():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(1.0)
    return time.monotonic() - t0

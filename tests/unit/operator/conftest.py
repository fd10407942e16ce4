"""Shared fixtures for the operator's unit tests: kwok nodes (hack/nodes.yaml), jobs, pods,
and the ingest service running on a loopback port."""

from __future__ import annotations

import asyncio
import copy
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.operator.ingest.main import IngestService
from dynamiccl.operator.ingest.settings import IngestSettings
from dynamiccl.testing import certs, scripts


@pytest.fixture(scope="session")
def kwok_nodes() -> dict[str, dict[str, Any]]:
    """The local cluster's fake GPU nodes, by name."""
    return {n["metadata"]["name"]: n for n in scripts.load("gen_nodes").expand()}


class RunningIngest:
    """The real `IngestService` (TLS, SQLite store) serving on a loopback port from its
    own thread's event loop; `reviewer` answers TokenReviews and pod owner lookups."""

    def __init__(self, tmp: Path, reviewer: Any, **settings: Any) -> None:
        self.crt, key = certs.write_self_signed(tmp / "tls")
        self.loop = asyncio.new_event_loop()
        self.svc = IngestService(
            IngestSettings(
                store_url=str(tmp / "exp.db"),
                tls_cert=self.crt,
                tls_key=key,
                host="127.0.0.1",
                port=0,
                **settings,
            ),
            reviewer=reviewer,
            resolver=reviewer,
        )
        # no caching between tests' toggles: tokens are reviewed every time
        self.svc.reviewer._ttl = 0
        self.svc.reviewer._neg_ttl = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.svc.start(), self.loop).result(30)
        self.ctx = ssl.create_default_context(cafile=str(self.crt))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.svc.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="session")
def running_ingest() -> type[RunningIngest]:
    """Start one with ``running_ingest(tmp, reviewer, **IngestSettings fields)``."""
    return RunningIngest


def _container(gpus: int, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ct: dict[str, Any] = {
        "name": "pytorch",
        "image": "example.com/train:1",
        "resources": {"limits": {c.RESOURCE_GPU: str(gpus)}},
    }
    if env:
        ct["env"] = env
    return ct


def template(gpus: int = 8, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "train"}},
        "spec": {"containers": [_container(gpus, env)]},
    }


@pytest.fixture
def pytorchjob() -> Callable[..., dict[str, Any]]:
    def make(
        *,
        name: str = "llm",
        workers: int = 1,
        gpus: int = 8,
        annotations: dict[str, str] | None = None,
        env: list[dict[str, Any]] | None = None,
        nproc: str | None = "auto",
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template(gpus, env)},
                "Worker": {"replicas": workers, "template": template(gpus, env)},
            }
        }
        if nproc is not None:
            spec["nprocPerNode"] = nproc
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "uid": "uid-" + name,
                "generation": 1,
                "labels": {"team": "a"},
                "annotations": {c.ANNOTATION_TUNE: "true", **(annotations or {})},
            },
            "spec": spec,
        }

    return make


def pod_on(job: dict[str, Any], index: int, node: str | None) -> dict[str, Any]:
    """A pod of the job as the training operator creates it (bound to `node`)."""
    name = job["metadata"]["name"]
    tmpl = copy.deepcopy(job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-worker-{index}",
            "namespace": job["metadata"]["namespace"],
            "labels": {
                c.LABEL_KUBEFLOW_JOB_NAME: name,
                c.LABEL_KUBEFLOW_REPLICA_TYPE: "worker",
            },
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
        "spec": tmpl["spec"],
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


@pytest.fixture
def pods_on() -> Callable[[dict[str, Any], list[str | None]], list[dict[str, Any]]]:
    def make(job: dict[str, Any], nodes: list[str | None]) -> list[dict[str, Any]]:
        return [pod_on(job, i, n) for i, n in enumerate(nodes)]

    return make

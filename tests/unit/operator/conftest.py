"""Shared fixtures for the operator's unit tests: kwok nodes (hack/nodes.yaml), jobs, pods."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c

ROOT = Path(__file__).resolve().parents[3]


def _gen_nodes() -> Any:
    spec = importlib.util.spec_from_file_location("gen_nodes", ROOT / "hack" / "gen_nodes.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kwok_nodes() -> dict[str, dict[str, Any]]:
    """The local cluster's fake GPU nodes, by name."""
    return {n["metadata"]["name"]: n for n in _gen_nodes().expand()}


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

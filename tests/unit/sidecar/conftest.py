"""A job ConfigMap as the webhook mounts it, for the sidecar's tests."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)
from tests.topology_samples import dgx_h100

NODE = dgx_h100(nodes=1)
JOB = {
    "namespace": "team-a",
    "name": "llm",
    "kind": "PyTorchJob",
    "api_version": "kubeflow.org/v1",
    "uid": "11111111-2222-3333-4444-555555555555",
    "policy": "default",
    "model_version": "default",
    "canary": False,
    "table_digest": "",
}


def features(replicas: int = 2, nproc: int = 4) -> StateFeatures:
    return StateFeatures.model_validate(
        {
            "world_size": replicas * nproc,
            "gpus_per_pod": nproc,
            "replicas": replicas,
            "nproc_per_node": nproc,
            "topology": NODE,
            "environment": {"container_boundary": True, "node_gpus": 8},
        }
    )


def learned_table(nranks: int = 8, nnodes: int = 2, version: int = 1) -> DecisionTable:
    sc = scale_class(nranks, nnodes)
    cells = tuple(
        Cell(
            collective=Collective.ALLREDUCE,
            bucket=b,
            scale=sc,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL128),),
            candidates=(
                Candidate(algo=Algo.RING, proto=Proto.SIMPLE, weight=100),
                Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, weight=50),
            ),
            explore=0.25,
        )
        for b in (16, 20, 24)
    )
    return DecisionTable(
        version=version,
        scales=(sc,),
        cells=cells,
        explore=ExploreSchedule(seed=3, half_life_log2=8),
    )


def exploration(mode: str = "learned") -> dict[str, Any]:
    return {
        "mode": mode,
        "policy": "default",
        "exploration": {"budgetCalls": 200, "maxCandidates": 4, "seed": 3},
        "guardrails": {"regressionThreshold": 0.05, "minSamples": 20},
        "constraints": {},
        "user_constraints": {},
    }


ConfigDir = Callable[..., Path]


def write_config(d: Path, **keys: Any) -> Path:
    """Write a config dir `d`; keyword overrides replace a key's content (None: leave it out)."""
    d.mkdir(exist_ok=True)
    content: dict[str, Any] = {
        "job.json": JOB,
        "features.json": features().model_dump(mode="json"),
        "table.json": learned_table().model_dump(mode="json"),
        "exploration.json": exploration(),
    }
    content.update({k.replace("_", ".", 1): v for k, v in keys.items()})
    for name, value in content.items():
        path = d / name
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(value if isinstance(value, str) else json.dumps(value))
    return d


@pytest.fixture
def config_dir(tmp_path: Path) -> ConfigDir:
    """`write_config` into tmp_path/config."""
    return functools.partial(write_config, tmp_path / "config")

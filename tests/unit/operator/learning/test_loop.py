"""The learning loop end to end on a real store, with the Kubernetes API as an in-memory table.

Rewards → TuningRun status; enough experience → a retraining Job; the Job's
model (written as `dynamiccl train` would) → candidate → canary → promoted;
a deliberately worse model → rolled back. The real-apiserver side is
tests/integration/operator/test_learning_loop_kube.py and test_model_lifecycle_kube.py.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

from dynamiccl.api.registry import ModelStatus, TrainedModelManifest
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import Resource
from dynamiccl.operator.learning.canary import Action
from dynamiccl.operator.learning.loop import (
    JOBS,
    LearningLoop,
    LoopConfig,
    primary_policy,
)
from dynamiccl.operator.learning.promotion import Criteria
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.testing.memory_api import Clock, MemoryAPI

_n = itertools.count()


def report(
    store: ExperienceStore, version: str, speedup: float, *, jobs: int = 1, job: str | None = None
) -> None:
    for _ in range(jobs):
        n = next(_n)
        name = job or f"job{n}"
        store.insert_batch(
            RewardBatch.model_validate(
                {
                    "idempotency_key": f"pod-{n}/1",
                    "job": {
                        "namespace": "team-a",
                        "kind": "PyTorchJob",
                        "name": name,
                        "uid": f"uid-{name}",
                    },
                    "pod": {"name": f"p{n}", "uid": f"pod-{n}"},
                    "model_version": version,
                    "table_version": 1,
                    "records": [
                        {
                            "collective": "allreduce",
                            "size_bucket": 20 + i,
                            "nbytes_min": 1 << (20 + i),
                            "nbytes_max": (2 << (20 + i)) - 1,
                            "nranks": 8,
                            "nnodes": 1,
                            "algo": "ring",
                            "proto": "simple",
                            "nchannels": 0,
                            "chunk_bytes": 0,
                            "origin": "table",
                            "count": 200,
                            "mean_time_us": 100.0,
                            "p50_time_us": 100.0,
                            "p99_time_us": 110.0,
                            "busbw_GBps": 50.0,
                            "nccl_default_time_us": 100.0 * speedup * (1 + 0.003 * (n % 3)),
                        }
                        for i in range(3)
                    ],
                }
            )
        )


def finish_training(
    api: MemoryAPI, volume: Path, job_name: str, weights: bytes, cursor: int = 0
) -> str:
    """What the retraining Job does: write the model + manifest (trained up to `cursor`)."""
    job = api.objs[("jobs", "dynamiccl-system", job_name)]
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    version: str = cmd[cmd.index("--version") + 1]
    out = volume / "models" / version
    out.mkdir(parents=True)
    (out / "model.pt").write_bytes(weights)
    (out / "manifest.json").write_text(
        TrainedModelManifest(
            version=version,
            model_file="model.pt",
            sha256=hashlib.sha256(weights).hexdigest(),
            parent=cmd[cmd.index("--parent") + 1],
            experience_cursor=cursor,
        ).model_dump_json()
    )
    job["status"] = {"succeeded": 1}
    return version


def test_primary_policy() -> None:
    def pol(name: str, prio: int, mode: str = "learned") -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"priority": prio, "mode": mode}}

    assert primary_policy([]) is None
    assert primary_policy([pol("a", 1, "static")]) is None
    got = primary_policy([pol("b", 1), pol("a", 1), pol("z", 5, "observe")])
    assert got is not None
    assert got["metadata"]["name"] == "a"


def test_the_whole_loop(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(str(tmp_path / "experience.db"), clock=clock)
    registry = ModelRegistry(store.backend, clock=clock)
    api = MemoryAPI(clock)
    api.add(
        Resource("dynamiccl.io", "v1alpha1", "nccltuningpolicies", namespaced=False),
        {
            "metadata": {
                "name": "default",
                "uid": "pol-uid",
                "creationTimestamp": "2023-01-01T00:00:00Z",
            },
            "spec": {
                "mode": "learned",
                "model": {"canaryPercent": 25},
                "retraining": {"minNewExperience": 12},
            },
        },
    )
    api.add(
        Resource("dynamiccl.io", "v1alpha1", "tuningruns"),
        {"metadata": {"name": "llm-dynamiccl", "namespace": "team-a"}},
    )
    loop = LearningLoop(
        store,
        registry,
        api,
        LoopConfig(
            namespace="dynamiccl-system",
            image="img:1",
            store_url="sqlite:////v/e.db",
            pvc_name="pvc",
            local_mount_path=str(tmp_path),
        ),
        clock=clock,
    )
    try:
        registry.bootstrap("default", sha256="0" * 64, uri="/m/default.pt")
        report(store, "default", 1.1, job="llm")  # 3 rows
        clock.t += 10  # (the status sync re-reads a 1 s overlap window)
        rep = loop.tick()
        assert rep.errors == []
        assert rep.statuses_patched == 1
        status = api.objs[("tuningruns", "team-a", "llm-dynamiccl")]["status"]
        assert status["reward"]["calls"] == 600
        assert abs(status["reward"]["speedup"] - 1.1) < 0.01
        assert rep.retrain is not None
        assert not rep.retrain.due  # 3 < 12 rows
        assert loop.tick().statuses_patched == 0  # nothing new

        report(store, "default", 1.1, jobs=3)  # 12 rows in total
        rep = loop.tick()
        assert rep.launched_job is not None, rep
        assert loop.tick().launched_job is None  # still running: never two at once

        v2 = finish_training(
            api, tmp_path, rep.launched_job, b"better weights", store.max_experience_id()
        )
        rep = loop.tick()
        assert rep.registered == [v2]
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.CANARY_STARTED, v2)

        report(store, "default", 1.10, jobs=4)
        report(store, v2, 1.30, jobs=4)
        rep = loop.tick()
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.PROMOTED, v2), rep.rollout
        promoted = registry.current(ModelStatus.PROMOTED)
        assert promoted is not None
        assert promoted.version == v2

        # the same tick started the next retraining, from the version promoted just now
        assert rep.launched_job is not None
        job = api.objs[("jobs", "dynamiccl-system", rep.launched_job)]
        cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert cmd[cmd.index("--parent") + 1] == v2
        # ... and it turns out deliberately worse
        v3 = finish_training(
            api, tmp_path, rep.launched_job, b"worse weights", store.max_experience_id()
        )
        assert loop.tick().rollout.action is Action.CANARY_STARTED  # type: ignore[union-attr]
        report(store, v2, 1.30, jobs=3)
        report(store, v3, 0.80, jobs=2)
        rep = loop.tick()
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.ROLLED_BACK, v3)
        assert {m.version: m.status for m in registry.list()} == {
            "default": ModelStatus.RETIRED,
            v2: ModelStatus.PROMOTED,
            v3: ModelStatus.ROLLED_BACK,
        }
        # 15 new rows since v3's cursor: the next run starts, again from v2 (still promoted)
        assert rep.launched_job is not None
        cmd = api.objs[("jobs", "dynamiccl-system", rep.launched_job)]["spec"]["template"]["spec"][
            "containers"
        ][0]["command"]
        assert cmd[cmd.index("--parent") + 1] == v2
        assert len(api.list(JOBS, "dynamiccl-system")) == 3
    finally:
        store.close()


def test_a_tampered_model_is_not_registered(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(str(tmp_path / "e.db"), clock=clock)
    registry = ModelRegistry(store.backend, clock=clock)
    api = MemoryAPI(clock)
    api.add(
        Resource("dynamiccl.io", "v1alpha1", "nccltuningpolicies", namespaced=False),
        {
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"model": {"canaryPercent": 10}, "retraining": {"minNewExperience": 1}},
        },
    )
    loop = LearningLoop(
        store,
        registry,
        api,
        LoopConfig(
            namespace="dynamiccl-system",
            image="i",
            store_url="s",
            pvc_name="v",
            local_mount_path=str(tmp_path),
            criteria=Criteria(),
        ),
        clock=clock,
    )
    try:
        report(store, "default", 1.0)
        name = loop.tick().launched_job
        assert name is not None
        version = finish_training(api, tmp_path, name, b"weights")
        (tmp_path / "models" / version / "model.pt").write_bytes(b"swapped")
        rep = loop.tick()
        assert rep.registered == []
        assert any("does not match" in e for e in rep.errors)
        assert registry.get(version) is None
    finally:
        store.close()

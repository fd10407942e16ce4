"""The handlers' pure parts (the rest runs against the real apiserver in integration/e2e),
against the in-memory API server (handler_support.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dynamiccl.operator.controller import configmap
from dynamiccl.operator.controller.cache import ObjectCache, shrink_config_map
from dynamiccl.operator.controller.handlers import POLICIES, TUNING_RUNS
from dynamiccl.operator.controller.job_events import job_fingerprint
from dynamiccl.operator.kube import CONFIGMAPS, ROLEBINDINGS, ROLES
from dynamiccl.testing.memory_api import MemoryAPI
from tests.unit.operator.controller.handler_support import (
    NS,
    PYTORCHJOBS,
    cluster,
    names,
    policy_event,
    pytorchjob,
    reconciler,
)


def test_first_tuning_grants_the_sidecars_their_objects() -> None:
    kube = cluster()
    assert reconciler(kube).apply(pytorchjob()) == "tuned"
    assert "llm-dynamiccl-sidecar" in names(kube, ROLES)
    assert "llm-dynamiccl-sidecar" in names(kube, ROLEBINDINGS)
    for suffix in ("epochs", "leader", "tables"):
        assert f"llm-dynamiccl-{suffix}" in names(kube, CONFIGMAPS)
    assert "llm-dynamiccl" in names(kube, CONFIGMAPS)


def test_refused_rbac_still_tunes_the_job() -> None:
    kube = cluster(refuse_rbac=True)
    assert reconciler(kube).apply(pytorchjob()) == "tuned"
    assert "llm-dynamiccl" in names(kube, CONFIGMAPS)
    assert kube.list(ROLES) == []
    assert kube.list(ROLEBINDINGS) == []


def test_a_job_whose_model_cannot_be_had_is_retried_until_it_compiles() -> None:
    """The canary model unavailable: NCCL's choice with the reason, then re-reconciled."""
    kube = cluster()
    rec = reconciler(kube)
    policy_event(
        kube,
        rec,
        "MODIFIED",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": "all", "uid": "p"},
            "spec": {"mode": "static", "model": {"version": "v7"}},
        },
    )
    available = {"v7": False}
    calls: list[bool] = []

    def compiler(features: Any, policy: Any, version: str) -> Any:
        calls.append(available[version])
        if not available[version]:
            raise configmap.ModelUnavailable("ingest answered HTTP 404: not registered")
        return {"format": configmap.TABLE_FORMAT, "version": 1, "cells": [{"x": 1}]}

    rec.compiler = compiler
    rec.retry_after_s = 0.05
    job = pytorchjob()
    kube.create(PYTORCHJOBS, job)

    def table() -> dict[str, Any]:
        cm = kube.get(CONFIGMAPS, "llm-dynamiccl", NS)
        return dict(json.loads(cm["data"][configmap.KEY_TABLE]))

    async def scenario() -> None:
        await rec.reconcile(job, "PyTorchJob")
        assert table()["reason"] == "no-model:v7: ingest answered HTTP 404: not registered"
        assert not rec.applied.unchanged("u-9", job_fingerprint(job, rec.policies.version))
        available["v7"] = True
        for _ in range(100):  # the retry re-reads the job and compiles
            await asyncio.sleep(0.02)
            if rec.applied.unchanged("u-9", job_fingerprint(job, rec.policies.version)):
                break
        assert calls[0] is False
        assert True in calls
        assert rec.applied.unchanged("u-9", job_fingerprint(job, rec.policies.version))

    asyncio.run(scenario())


def _static_policy(default: int) -> dict[str, Any]:
    knob = {"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": default}
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": "all", "uid": "p"},
        "spec": {"mode": "static", "constraints": {"envKnobs": [knob]}},
    }


def _env_of(kube: MemoryAPI) -> dict[str, str]:
    cm = kube.get(CONFIGMAPS, "llm-dynamiccl", NS)
    return dict(json.loads(cm["data"][configmap.KEY_ENV]))


def test_a_job_keeps_its_env_knobs_but_a_new_job_of_the_same_name_does_not() -> None:
    """The ConfigMap cache still holds the ConfigMap of a deleted job of the same name (its
    garbage collection pending): the new job (another uid) is given knobs afresh."""
    kube = cluster()
    rec = reconciler(kube)
    policy_event(kube, rec, "MODIFIED", _static_policy(512))
    assert rec.apply(pytorchjob()) == "tuned"
    assert _env_of(kube) == {"NCCL_NTHREADS": "512"}
    rec.config_maps.on_event("ADDED", kube.get(CONFIGMAPS, "llm-dynamiccl", NS))

    policy_event(kube, rec, "MODIFIED", _static_policy(256))
    inputs = rec.inputs(pytorchjob())
    assert inputs is not None
    assert inputs.previous_env == {"NCCL_NTHREADS": "512"}  # the same job keeps its knobs

    recreated = pytorchjob()
    recreated["metadata"]["uid"] = "u-10"
    inputs = rec.inputs(recreated)
    assert inputs is not None
    assert inputs.previous_env is None
    assert rec.apply(recreated) == "tuned"
    assert _env_of(kube) == {"NCCL_NTHREADS": "256"}


def _policy_matched(kube: MemoryAPI) -> tuple[str, str]:
    run = kube.get(TUNING_RUNS, "llm-dynamiccl", NS)
    [cond] = [c for c in run["status"]["conditions"] if c["type"] == "PolicyMatched"]
    return run["spec"]["policyName"], cond["reason"]


def test_deleting_the_policy_leaves_finished_runs_as_they_ended() -> None:
    """A finished job keeps the record of the policy that tuned it; a running one does not."""
    for condition, kept in (("Succeeded", True), ("Failed", True), ("Running", False)):
        kube = cluster()
        rec = reconciler(kube)
        job = pytorchjob()
        assert rec.apply(job) == "tuned"
        assert _policy_matched(kube) == ("all", "Matched")
        rec.config_maps.on_event("ADDED", kube.get(CONFIGMAPS, "llm-dynamiccl", NS))
        job["status"] = {"conditions": [{"type": condition, "status": "True"}]}
        policy_event(kube, rec, "DELETED", {"metadata": {"name": "all", "uid": "p"}})
        rec.apply(job)
        if kept:
            assert _policy_matched(kube) == ("all", "Matched"), condition
            assert "llm-dynamiccl" in names(kube, CONFIGMAPS)
        else:
            assert _policy_matched(kube) == ("", "NoPolicy")
            assert "llm-dynamiccl" not in names(kube, CONFIGMAPS)


def test_a_new_job_gets_the_promotion_the_apiserver_has_though_the_watch_lags() -> None:
    """The learning loop promoted v8 (the policy's status.learning on the apiserver) but the
    operator's policy watch has not delivered that yet: a job without a table is compiled
    with v8, the version it keeps for life. (An integration run on a loaded machine saw
    the cache's old status hand a new job the old model.)"""
    kube = cluster()
    rec = reconciler(kube)  # its cache: the policy without any learning status
    promoted = {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": "all", "uid": "p"},
        "spec": {"mode": "static"},
        "status": {"learning": {"rollout": {"promoted": "v8", "canaryPercent": 0}}},
    }
    kube.add(POLICIES, promoted)  # the apiserver has it; the watch has not delivered it
    versions: list[str] = []

    def compiler(features: Any, policy: Any, version: str) -> Any:
        versions.append(version)
        return {"format": 2, "version": 1, "cells": []}

    rec.compiler = compiler
    job = pytorchjob()
    kube.create(PYTORCHJOBS, job)
    asyncio.run(rec.reconcile(job, "PyTorchJob"))
    assert versions == ["v8"], versions
    run = kube.get(TUNING_RUNS, "llm-dynamiccl", NS)
    assert run["spec"]["modelVersion"] == "v8", run["spec"]


def test_a_running_jobs_reconcile_reads_its_table_from_the_apiserver_not_the_cache() -> None:
    """The ConfigMap cache keeps no tables; the decision gets the job's ConfigMap as stored
    (to keep its table: configmap.py `kept_table`), and nothing for a new job of that name."""
    kube = cluster()
    rec = reconciler(kube)
    rec.config_maps = ObjectCache(shrink_config_map)  # as the operator runs it
    assert rec.apply(pytorchjob()) == "tuned"
    stored = kube.get(CONFIGMAPS, "llm-dynamiccl", NS)
    rec.config_maps.on_event("ADDED", stored)
    cached = rec.config_maps.get(NS, "llm-dynamiccl")
    assert cached is not None
    assert "table.json" not in cached["data"]
    inputs = rec.inputs(pytorchjob())
    assert inputs is not None
    assert inputs.previous_config is not None
    assert inputs.previous_config["data"]["table.json"] == stored["data"]["table.json"]
    recreated = pytorchjob()
    recreated["metadata"]["uid"] = "u-10"
    again = rec.inputs(recreated)
    assert again is not None
    assert again.previous_config is None


def test_new_jobs_get_the_canary_by_count_and_a_job_keeps_what_it_was_given() -> None:
    """A canary at 20 %: of 15 new jobs, the 3rd, 8th and 13th run it (the operator counts
    them: no uid's luck); a job reconciled again before its ConfigMap reaches the cache keeps
    its model, and is not counted twice."""
    kube = cluster()
    rec = reconciler(kube)
    rollout = {"promoted": "v1", "canary": "v2", "canaryPercent": 20}
    policy_event(
        kube,
        rec,
        "MODIFIED",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": "all", "uid": "p"},
            "spec": {"mode": "observe"},
            "status": {"learning": {"rollout": rollout}},
        },
    )
    got = []
    for i in range(15):
        job = pytorchjob()
        job["metadata"]["uid"] = f"u-{i}"
        job["metadata"]["name"] = f"llm-{i}"
        assert rec.apply(job) == "tuned"
        got.append(kube.get(TUNING_RUNS, f"llm-{i}-dynamiccl", NS)["spec"]["modelVersion"])
        if i == 2:  # again, the ConfigMap not in the cache yet: the same model, no new count
            assert rec.apply(job) == "tuned"
            run = kube.get(TUNING_RUNS, f"llm-{i}-dynamiccl", NS)
            assert run["spec"]["modelVersion"] == "v2"
    assert [i + 1 for i, v in enumerate(got) if v == "v2"] == [3, 8, 13]
    assert rec.canary_seen == {"v2": 15}

"""A job keeps the model version its first decision gave it, whatever the rollout does later.

The compiler is a stand-in (the real one fetches retrained models from the ingest): it
compiles a one-cell table that names the version it was asked for, so a table compiled
from another version differs. Everything else is the operator's and the ingest's own code:
the decision, the ConfigMap it writes and reads back, the TuningRun the ingest reads, and
the ingest's assigned-model check.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.rewards import JobRef, RewardBatch
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap, reconcile
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.ingest.auth import Caller, authorize
from dynamiccl.operator.ingest.kube import assigned_model_of

Job = Callable[..., dict[str, Any]]


def _compile(_f: StateFeatures, _p: NCCLTuningPolicySpec, version: str) -> dict[str, Any]:
    """Stand-in compiler: a table whose one cell says which model version compiled it."""
    cell = {"collective": "allreduce", "algo": "ring", "proto": "simple", "by": version}
    return {"format": configmap.TABLE_FORMAT, "version": 1, "cells": [cell]}


def _policy(promoted: str, canary: str | None, percent: int) -> dict[str, Any]:
    rollout = {"promoted": promoted, "canary": canary, "canaryPercent": percent}
    return {
        "metadata": {"name": "gold"},
        "spec": {"mode": "static"},
        "status": {"learning": {"rollout": rollout}},
    }


def _decide(
    job: dict[str, Any], policy: dict[str, Any], previous: dict[str, Any] | None
) -> reconcile.Outcome:
    """One reconcile, with what the handler reads back from the job's current ConfigMap."""
    pols, _ = parse_policies([policy])
    uid = job["metadata"]["uid"]
    out = reconcile.decide(
        reconcile.Inputs(
            job=job,
            namespace_labels={},
            policies=pols,
            compiler=_compile,
            previous_model=configmap.read_model(previous, uid) if previous else None,
        )
    )
    assert out is not None
    assert out.config_map is not None
    return out


def _model(out: reconcile.Outcome) -> tuple[str, str, str, bool]:
    """(TuningRun's version, ConfigMap's version, the version that compiled the table, canary)."""
    assert out.config_map is not None
    data = out.config_map["data"]
    meta, table = json.loads(data[configmap.KEY_JOB]), json.loads(data[configmap.KEY_TABLE])
    spec = out.tuning_run["spec"]
    assert spec["canary"] is meta["canary"]
    [cell] = table["cells"]
    return spec["modelVersion"], meta["model_version"], cell["by"], meta["canary"]


def _batch(job: dict[str, Any], version: str) -> tuple[Caller, RewardBatch, JobRef]:
    meta = job["metadata"]
    ref = JobRef(namespace=meta["namespace"], kind=job["kind"], name=meta["name"], uid=meta["uid"])
    ns = meta["namespace"]
    caller = Caller(f"system:serviceaccount:{ns}:default", ns, "default", "w-0", "pod-1")
    rec = {
        "collective": "allreduce", "size_bucket": 10, "nbytes_min": 1024, "nbytes_max": 2047,
        "nranks": 2, "nnodes": 1, "algo": "ring", "proto": "ll", "nchannels": 0,
        "chunk_bytes": 0, "origin": "table", "count": 1, "mean_time_us": 5.0,
        "p50_time_us": 5.0, "p99_time_us": 5.0, "busbw_GBps": 1.0,
        "nccl_default_time_us": 6.0,
    }  # fmt: skip
    batch = RewardBatch.model_validate(
        {
            "idempotency_key": "pod-1/1",
            "job": ref.model_dump(),
            "pod": {"name": "w-0", "uid": "pod-1"},
            "model_version": version,
            "table_version": 0,
            "records": [rec],
        }
    )
    return caller, batch, ref


def test_a_job_keeps_its_model_through_a_rollout_change(pytorchjob: Job) -> None:
    job = pytorchjob()
    before = _policy("v1", "v2", 100)  # every new job is in v2's canary
    first = _decide(job, before, None)
    assert _model(first) == ("v2", "v2", "v2", True)

    after = _policy("v3", None, 0)  # v2 rolled back, v3 promoted
    again = _decide(job, after, first.config_map)
    assert _model(again) == ("v2", "v2", "v2", True)
    assert again.config_map is not None
    assert first.config_map is not None
    table = configmap.KEY_TABLE
    assert again.config_map["data"][table] == first.config_map["data"][table]
    assert again.tuning_run["spec"]["tableDigest"] == first.tuning_run["spec"]["tableDigest"]

    # the ingest still takes the job's rewards for v2 (and only v2)
    caller, batch, ref = _batch(job, "v2")
    assigned = assigned_model_of(again.tuning_run, ref)
    assert assigned == "v2"
    assert authorize(caller, batch, ref, assigned) is None
    _, other, _ = _batch(job, "v3")
    assert "assigned model 'v2'" in (authorize(caller, other, ref, assigned) or "")

    # a new job gets the rollout as it is now
    fresh = _decide(pytorchjob(name="next"), after, None)
    assert _model(fresh) == ("v3", "v3", "v3", False)


def test_a_config_map_of_another_job_of_the_same_name_is_not_inherited(pytorchjob: Job) -> None:
    first = _decide(pytorchjob(), _policy("v1", "v2", 100), None)
    assert first.config_map is not None
    recreated = pytorchjob()
    recreated["metadata"]["uid"] = "uid-llm-again"
    out = _decide(recreated, _policy("v3", None, 0), first.config_map)
    assert _model(out) == ("v3", "v3", "v3", False)


def test_read_model_ignores_malformed_config_maps() -> None:
    assert configmap.read_model({"data": {configmap.KEY_JOB: "not json"}}, "u") is None
    assert configmap.read_model({"data": {configmap.KEY_JOB: "[1]"}}, "u") is None
    meta = json.dumps({"uid": "u", "model_version": 7})
    assert configmap.read_model({"data": {configmap.KEY_JOB: meta}}, "u") is None

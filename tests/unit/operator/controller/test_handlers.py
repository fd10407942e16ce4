"""The handlers' pure parts (the rest runs against the real apiserver in integration/e2e)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dynamiccl.api import topo_nodes
from dynamiccl.operator.controller.job_events import job_fingerprint
from dynamiccl.testing import builders


class _RecordingKube:
    """Our `Kube` wrapper's surface as `Reconciler.apply` uses it; refuses RBAC writes
    when `refuse_rbac` (a trimmed chart)."""

    def __init__(self, refuse_rbac: bool) -> None:
        self.refuse_rbac = refuse_rbac
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.policies: Any = None  # the reconciler's policy cache, set by _reconciler

    def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        if res.plural == "namespaces":
            return {"metadata": {"name": name, "labels": {}}}
        from dynamiccl.operator.kube import NotFoundError  # noqa: PLC0415

        try:
            return self.objects[(res.plural, name)]
        except KeyError:
            raise NotFoundError(name) from None

    def list(self, res: Any, namespace: str | None = None, label_selector: str = "") -> list[Any]:
        """Policies are what the reconciler's policy cache holds (the apiserver and the
        watch agree here); no pods."""
        if res.plural == "nccltuningpolicies" and self.policies is not None:
            return list(self.policies.values())
        return []

    def create(self, res: Any, body: dict[str, Any]) -> dict[str, Any]:
        from dynamiccl.operator.kube import ConflictError  # noqa: PLC0415

        if self.refuse_rbac and res.group == "rbac.authorization.k8s.io":
            raise RuntimeError(f"{res.plural}: 403 Forbidden")
        key = (res.plural, body["metadata"]["name"])
        if key in self.objects:
            raise ConflictError(key[1])
        self.objects[key] = dict(body)
        return dict(body)

    def patch(self, res: Any, name: str, patch: Any, namespace: Any = None, **_: Any) -> Any:
        """A JSON merge patch (RFC 7386), as the API server applies it."""

        def merge(into: dict[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(into)
            for k, v in change.items():
                if v is None:
                    out.pop(k, None)
                elif isinstance(v, Mapping):
                    out[k] = merge(out.get(k) or {}, v)
                else:
                    out[k] = v
            return out

        key = (res.plural, name)
        self.objects[key] = merge(self.objects.get(key, {}), patch)
        return self.objects[key]

    def delete(self, res: Any, name: str, namespace: str | None = None) -> None:
        self.objects.pop((res.plural, name), None)

    def event(self, body: Any) -> None:
        pass


def _pytorchjob() -> dict[str, Any]:
    return builders.pytorchjob(
        "llm",
        namespace="team",
        uid="u-9",
        annotations={"dynamiccl.io/tune": "true"},
        master=False,
        workers=2,
        pod=builders.template(builders.container(gpus=0, image="x")),
        nproc_per_node=None,
    )


def _reconciler(kube: _RecordingKube) -> Any:
    from dynamiccl.operator.controller.cache import ObjectCache  # noqa: PLC0415
    from dynamiccl.operator.controller.handlers import Reconciler  # noqa: PLC0415

    policies = ObjectCache()
    policies.on_event(
        "ADDED",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": "all", "uid": "p"},
            "spec": {"mode": "observe"},
        },
    )
    kube.policies = policies
    return Reconciler(kube, ObjectCache(), policies, ObjectCache(), ObjectCache())  # type: ignore[arg-type]


def test_first_tuning_grants_the_sidecars_their_objects() -> None:
    kube = _RecordingKube(refuse_rbac=False)
    assert _reconciler(kube).apply(_pytorchjob()) == "tuned"
    made = set(kube.objects)
    assert ("roles", "llm-dynamiccl-sidecar") in made
    assert ("rolebindings", "llm-dynamiccl-sidecar") in made
    for suffix in ("epochs", "leader", "tables"):
        assert ("configmaps", f"llm-dynamiccl-{suffix}") in made
    assert ("configmaps", "llm-dynamiccl") in made


def test_refused_rbac_still_tunes_the_job() -> None:
    kube = _RecordingKube(refuse_rbac=True)
    assert _reconciler(kube).apply(_pytorchjob()) == "tuned"
    assert ("configmaps", "llm-dynamiccl") in kube.objects
    assert not any(k[0] in ("roles", "rolebindings") for k in kube.objects)


def test_a_job_whose_model_cannot_be_had_is_retried_until_it_compiles() -> None:
    """The canary model unavailable: NCCL's choice with the reason, then re-reconciled."""
    import asyncio  # noqa: PLC0415

    from dynamiccl.operator.controller import configmap  # noqa: PLC0415

    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)
    rec.policies.on_event(
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
    job = _pytorchjob()
    kube.objects[("pytorchjobs", "llm")] = job

    def table() -> dict[str, Any]:
        cm = kube.objects[("configmaps", "llm-dynamiccl")]
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


def _env_of(kube: _RecordingKube) -> dict[str, str]:
    from dynamiccl.operator.controller import configmap  # noqa: PLC0415

    cm = kube.objects[("configmaps", "llm-dynamiccl")]
    return dict(json.loads(cm["data"][configmap.KEY_ENV]))


def test_a_job_keeps_its_env_knobs_but_a_new_job_of_the_same_name_does_not() -> None:
    """The ConfigMap cache still holds the ConfigMap of a deleted job of the same name (its
    garbage collection pending): the new job (another uid) is given knobs afresh."""
    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)
    rec.policies.on_event("MODIFIED", _static_policy(512))
    assert rec.apply(_pytorchjob()) == "tuned"
    assert _env_of(kube) == {"NCCL_NTHREADS": "512"}
    rec.config_maps.on_event("ADDED", kube.objects[("configmaps", "llm-dynamiccl")])

    rec.policies.on_event("MODIFIED", _static_policy(256))
    inputs = rec.inputs(_pytorchjob())
    assert inputs is not None
    assert inputs.previous_env == {"NCCL_NTHREADS": "512"}  # the same job keeps its knobs

    recreated = _pytorchjob()
    recreated["metadata"]["uid"] = "u-10"
    inputs = rec.inputs(recreated)
    assert inputs is not None
    assert inputs.previous_env is None
    assert rec.apply(recreated) == "tuned"
    assert _env_of(kube) == {"NCCL_NTHREADS": "256"}


def _policy_matched(kube: _RecordingKube) -> tuple[str, str]:
    run = kube.objects[("tuningruns", "llm-dynamiccl")]
    [cond] = [c for c in run["status"]["conditions"] if c["type"] == "PolicyMatched"]
    return run["spec"]["policyName"], cond["reason"]


def test_deleting_the_policy_leaves_finished_runs_as_they_ended() -> None:
    """A finished job keeps the record of the policy that tuned it; a running one does not."""
    for condition, kept in (("Succeeded", True), ("Failed", True), ("Running", False)):
        kube = _RecordingKube(refuse_rbac=False)
        rec = _reconciler(kube)
        job = _pytorchjob()
        assert rec.apply(job) == "tuned"
        assert _policy_matched(kube) == ("all", "Matched")
        rec.config_maps.on_event("ADDED", kube.objects[("configmaps", "llm-dynamiccl")])
        job["status"] = {"conditions": [{"type": condition, "status": "True"}]}
        rec.policies.on_event("DELETED", {"metadata": {"name": "all", "uid": "p"}})
        rec.apply(job)
        if kept:
            assert _policy_matched(kube) == ("all", "Matched"), condition
            assert ("configmaps", "llm-dynamiccl") in kube.objects
        else:
            assert _policy_matched(kube) == ("", "NoPolicy")
            assert ("configmaps", "llm-dynamiccl") not in kube.objects


def test_a_new_job_gets_the_promotion_the_apiserver_has_though_the_watch_lags() -> None:
    """The learning loop promoted v8 (the policy's status.learning on the apiserver) but the
    operator's policy watch has not delivered that yet: a job without a table is compiled
    with v8, the version it keeps for life. (An integration run on a loaded machine saw
    the cache's old status hand a new job the old model.)"""
    import asyncio  # noqa: PLC0415

    from dynamiccl.operator.controller.cache import ObjectCache  # noqa: PLC0415

    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)  # its cache: the policy without any learning status
    promoted = {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": "all", "uid": "p"},
        "spec": {"mode": "static"},
        "status": {"learning": {"rollout": {"promoted": "v8", "canaryPercent": 0}}},
    }
    kube.policies = ObjectCache()
    kube.policies.on_event("ADDED", promoted)
    versions: list[str] = []

    def compiler(features: Any, policy: Any, version: str) -> Any:
        versions.append(version)
        return {"format": 2, "version": 1, "cells": []}

    rec.compiler = compiler
    job = _pytorchjob()
    kube.objects[("pytorchjobs", "llm")] = job
    asyncio.run(rec.reconcile(job, "PyTorchJob"))
    assert versions == ["v8"], versions
    run = kube.objects[("tuningruns", "llm-dynamiccl")]
    assert run["spec"]["modelVersion"] == "v8", run["spec"]


# --- pod bindings: coalesced per job, none lost ----------------------------------------
def _bound_pod(name: str) -> dict[str, Any]:
    from dynamiccl import constants as c  # noqa: PLC0415

    labels = {c.LABEL_KUBEFLOW_JOB_NAME: "llm"}
    return {"metadata": {"name": name, "namespace": "team", "labels": labels}}


def _passes_for(bindings: Any, monkeypatch: Any) -> int:
    """Refinement passes the reconciler runs for `bindings(rec, first_pass_running)`: an
    async function that reports pod bindings; the first pass holds until it returns."""
    import asyncio  # noqa: PLC0415

    rec = _reconciler(_RecordingKube(refuse_rbac=False))
    rec.bind_coalesce_s = 0.01
    job = _pytorchjob()
    monkeypatch.setattr(rec, "job_of_pod", lambda pod: job)
    passes: list[bool] = []

    async def scenario() -> None:
        running, release = asyncio.Event(), asyncio.Event()

        async def reconcile(j: Any, kind: str, *, force: bool = False) -> None:
            passes.append(force)
            if len(passes) == 1:  # the first pass listed the pods and now writes
                running.set()
                await release.wait()

        monkeypatch.setattr(rec, "reconcile", reconcile)
        await bindings(rec, running)
        release.set()
        await asyncio.wait_for(asyncio.gather(*rec._pending.values()), 5)

    asyncio.run(scenario())
    assert all(passes), passes  # every pass refines (force)
    return len(passes)


def test_a_pod_bound_while_its_jobs_pass_runs_gets_a_pass_of_its_own(monkeypatch: Any) -> None:
    """A pass lists the job's pods, then writes; a pod bound after that list was taken
    must get another pass. Before, its event was dropped as coalesced into the running
    pass, and the job kept features without that pod (never `scheduled`): an e2e or real
    tier job whose second pod was bound late waited for its refined TuningRun in vain."""
    import asyncio  # noqa: PLC0415

    async def late(rec: Any, running: asyncio.Event) -> None:
        await rec.pod_bound(_bound_pod("llm-worker-0"))
        await asyncio.wait_for(running.wait(), 5)
        await rec.pod_bound(_bound_pod("llm-worker-1"))  # bound after the first pass listed

    assert _passes_for(late, monkeypatch) == 2


def test_pods_bound_together_are_refined_in_one_pass(monkeypatch: Any) -> None:
    import asyncio  # noqa: PLC0415

    async def together(rec: Any, running: asyncio.Event) -> None:
        for i in range(4):  # all seen while the pass still waits: its pod list has them all
            await rec.pod_bound(_bound_pod(f"llm-worker-{i}"))
        await asyncio.wait_for(running.wait(), 5)

    assert _passes_for(together, monkeypatch) == 1


def _topology(node: str, xml: str) -> dict[str, Any]:
    """A NodeTopology as the operator's cache keeps it, with a topology file."""
    return {"metadata": {"name": node}, "status": {"ncclTopoFile": {"reason": "r", "xml": xml}}}


def _job_named(name: str) -> dict[str, Any]:
    job = _pytorchjob()
    job["metadata"] |= {"name": name, "uid": f"u-{name}"}
    return job


def test_the_clusters_topology_files_are_built_once_per_change_not_per_job(
    monkeypatch: Any,
) -> None:
    """Every job's ConfigMap carries the cluster's topology files: they are parsed and keyed
    once while the NodeTopologies stay as they are (O(nodes) per job before: at 12 500 nodes
    ~2/3 of a reconcile), and a NodeTopology event reaches the next job's ConfigMap."""
    from dynamiccl.operator.controller import topo_files  # noqa: PLC0415

    keyed: list[str] = []
    real_key = topo_files.file_key

    def counted_key(xml: str) -> str:
        keyed.append(xml)
        return real_key(xml)

    monkeypatch.setattr(topo_files, "file_key", counted_key)
    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)
    for i in range(50):
        rec.node_topologies.on_event("ADDED", _topology(f"n-{i:02d}", f"<system n='{i % 2}'/>"))
    for j in range(5):
        assert rec.apply(_job_named(f"j{j}")) == "tuned"
    assert len(keyed) == 50  # one pass over the 50 nodes for 5 jobs (250 before)
    cm = kube.objects[("configmaps", "j4-dynamiccl")]
    assert topo_nodes.of_config_map(cm) == {
        f"n-{i:02d}": real_key(f"<system n='{i % 2}'/>") for i in range(50)
    }
    rec.node_topologies.on_event("ADDED", _topology("n-50", "<system n='new'/>"))
    assert rec.apply(_job_named("j5")) == "tuned"
    late = topo_nodes.of_config_map(kube.objects[("configmaps", "j5-dynamiccl")])
    assert late["n-50"] == real_key("<system n='new'/>")
    assert len(keyed) == 101


def test_a_running_jobs_reconcile_reads_its_table_from_the_apiserver_not_the_cache() -> None:
    """The ConfigMap cache keeps no tables; the decision gets the job's ConfigMap as stored
    (to keep its table: configmap.py `kept_table`), and nothing for a new job of that name."""
    from dynamiccl.operator.controller.cache import ObjectCache, shrink_config_map  # noqa: PLC0415

    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)
    rec.config_maps = ObjectCache(shrink_config_map)  # as the operator runs it
    assert rec.apply(_pytorchjob()) == "tuned"
    stored = kube.objects[("configmaps", "llm-dynamiccl")]
    rec.config_maps.on_event("ADDED", stored)
    assert "table.json" not in rec.config_maps.get("team", "llm-dynamiccl")["data"]
    inputs = rec.inputs(_pytorchjob())
    assert inputs is not None
    assert inputs.previous_config is not None
    assert inputs.previous_config["data"]["table.json"] == stored["data"]["table.json"]
    recreated = _pytorchjob()
    recreated["metadata"]["uid"] = "u-10"
    again = rec.inputs(recreated)
    assert again is not None
    assert again.previous_config is None


def test_new_jobs_get_the_canary_by_count_and_a_job_keeps_what_it_was_given() -> None:
    """A canary at 20 %: of 15 new jobs, the 3rd, 8th and 13th run it (the operator counts
    them: no uid's luck); a job reconciled again before its ConfigMap reaches the cache keeps
    its model, and is not counted twice."""
    kube = _RecordingKube(refuse_rbac=False)
    rec = _reconciler(kube)
    rollout = {"promoted": "v1", "canary": "v2", "canaryPercent": 20}
    rec.policies.on_event(
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
        job = _pytorchjob()
        job["metadata"]["uid"] = f"u-{i}"
        job["metadata"]["name"] = f"llm-{i}"
        assert rec.apply(job) == "tuned"
        got.append(kube.objects[("tuningruns", f"llm-{i}-dynamiccl")]["spec"]["modelVersion"])
        if i == 2:  # again, the ConfigMap not in the cache yet: the same model, no new count
            assert rec.apply(job) == "tuned"
            run = kube.objects[("tuningruns", f"llm-{i}-dynamiccl")]
            assert run["spec"]["modelVersion"] == "v2"
    assert [i + 1 for i, v in enumerate(got) if v == "v2"] == [3, 8, 13]
    assert rec.canary_seen == {"v2": 15}

"""The handlers' pod bindings (coalesced per job, none lost) and the cluster's topology
files in every job's ConfigMap, against the in-memory API server (handler_support.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from dynamiccl import constants as c
from dynamiccl.api import topo_nodes
from dynamiccl.operator.controller import topo_files
from dynamiccl.operator.kube import CONFIGMAPS
from tests.unit.operator.controller.handler_support import NS, cluster, pytorchjob, reconciler


def _bound_pod(name: str) -> dict[str, Any]:
    labels = {c.LABEL_KUBEFLOW_JOB_NAME: "llm"}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels}}


def _passes_for(bindings: Any, monkeypatch: Any) -> int:
    """Refinement passes the reconciler runs for `bindings(rec, first_pass_running)`: an
    async function that reports pod bindings; the first pass holds until it returns."""
    rec = reconciler(cluster())
    rec.bind_coalesce_s = 0.01
    job = pytorchjob()
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

    async def late(rec: Any, running: asyncio.Event) -> None:
        await rec.pod_bound(_bound_pod("llm-worker-0"))
        await asyncio.wait_for(running.wait(), 5)
        await rec.pod_bound(_bound_pod("llm-worker-1"))  # bound after the first pass listed

    assert _passes_for(late, monkeypatch) == 2


def test_pods_bound_together_are_refined_in_one_pass(monkeypatch: Any) -> None:
    async def together(rec: Any, running: asyncio.Event) -> None:
        for i in range(4):  # all seen while the pass still waits: its pod list has them all
            await rec.pod_bound(_bound_pod(f"llm-worker-{i}"))
        await asyncio.wait_for(running.wait(), 5)

    assert _passes_for(together, monkeypatch) == 1


def _topology(node: str, xml: str) -> dict[str, Any]:
    """A NodeTopology as the operator's cache keeps it, with a topology file."""
    return {"metadata": {"name": node}, "status": {"ncclTopoFile": {"reason": "r", "xml": xml}}}


def _job_named(name: str) -> dict[str, Any]:
    job = pytorchjob()
    job["metadata"] |= {"name": name, "uid": f"u-{name}"}
    return job


def test_the_clusters_topology_files_are_built_once_per_change_not_per_job(
    monkeypatch: Any,
) -> None:
    """Every job's ConfigMap carries the cluster's topology files: they are parsed and keyed
    once while the NodeTopologies stay as they are (O(nodes) per job before: at 12 500 nodes
    ~2/3 of a reconcile), and a NodeTopology event reaches the next job's ConfigMap."""
    keyed: list[str] = []
    real_key = topo_files.file_key

    def counted_key(xml: str) -> str:
        keyed.append(xml)
        return real_key(xml)

    monkeypatch.setattr(topo_files, "file_key", counted_key)
    kube = cluster()
    rec = reconciler(kube)
    for i in range(50):
        rec.node_topologies.on_event("ADDED", _topology(f"n-{i:02d}", f"<system n='{i % 2}'/>"))
    for j in range(5):
        assert rec.apply(_job_named(f"j{j}")) == "tuned"
    assert len(keyed) == 50  # one pass over the 50 nodes for 5 jobs (250 before)
    cm = kube.get(CONFIGMAPS, "j4-dynamiccl", NS)
    assert topo_nodes.of_config_map(cm) == {
        f"n-{i:02d}": real_key(f"<system n='{i % 2}'/>") for i in range(50)
    }
    rec.node_topologies.on_event("ADDED", _topology("n-50", "<system n='new'/>"))
    assert rec.apply(_job_named("j5")) == "tuned"
    late = topo_nodes.of_config_map(kube.get(CONFIGMAPS, "j5-dynamiccl", NS))
    assert late["n-50"] == real_key("<system n='new'/>")
    assert len(keyed) == 101

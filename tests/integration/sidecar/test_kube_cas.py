"""The Kubernetes backends of the epoch protocol against a REAL kube-apiserver.

Cluster: ``cluster_kubeconfig`` of tests/integration/conftest.py. Every object
lives in a namespace of this test, deleted at the end.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from dynamiccl.api import sidecar_objects
from dynamiccl.api.epoch import EpochStatus
from dynamiccl.api.table import DecisionTable
from dynamiccl.kubeclient import api_client
from dynamiccl.sidecar.ballots import Ballot, Vote
from dynamiccl.sidecar.cas import load_record
from dynamiccl.sidecar.config import JobInfo
from dynamiccl.sidecar.kube_cas import KubeCAS, KubeTableStore, kube_backends, kube_ballots
from dynamiccl.sidecar.leader import Lease
from dynamiccl.sidecar.proposer import Coordinator, init_record


@pytest.fixture
def job(cluster_kubeconfig: Path) -> Iterator[JobInfo]:
    api = api_client(cluster_kubeconfig)
    core = k8s.CoreV1Api(api)
    ns = f"agent-cas-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    # a ConfigMap named like the job stands in for it (owner of our objects: same GC rules)
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "llm"}})  # type: ignore[arg-type]  # the client takes dict bodies
    assert cm.metadata is not None
    assert cm.metadata.uid is not None
    try:
        yield JobInfo(
            namespace=ns, name="llm", kind="ConfigMap", api_version="v1", uid=cm.metadata.uid
        )
    finally:
        core.delete_namespace(ns, propagation_policy="Background")


def test_cas_refuses_stale_versions_and_exactly_one_concurrent_writer_wins(
    cluster_kubeconfig: Path, job: JobInfo
) -> None:
    store = KubeCAS(
        api_client(cluster_kubeconfig), job, sidecar_objects.epochs_name(job.name), "epoch-record"
    )
    assert store.read() == (None, 0)
    assert store.cas(0, "one")
    assert not store.cas(0, "again")  # AlreadyExists
    value, v1 = store.read()
    assert value == "one"
    assert store.cas(v1, "two")
    assert not store.cas(v1, "stale")  # Conflict
    assert store.read()[0] == "two"
    _, v2 = store.read()
    wins: list[bool] = []
    stores = [
        KubeCAS(api_client(cluster_kubeconfig), job, store.name, "epoch-record") for _ in range(6)
    ]
    for s in stores:
        s.read()  # each learns v2
    threads = [
        threading.Thread(target=lambda s=s, i=i: wins.append(s.cas(v2, f"w{i}")))
        for i, s in enumerate(stores)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1
    cm = k8s.CoreV1Api(api_client(cluster_kubeconfig)).read_namespaced_config_map(
        store.name, job.namespace
    )
    meta = cm.metadata
    assert meta is not None
    assert meta.owner_references
    assert meta.labels is not None
    assert meta.owner_references[0].uid == job.uid  # garbage-collected with the job
    assert meta.labels["app.kubernetes.io/managed-by"] == "dynamiccl"


def test_tables_lease_and_a_whole_epoch_on_the_api_server(
    cluster_kubeconfig: Path, job: JobInfo
) -> None:
    record, lease_store, tables = kube_backends(job, cluster_kubeconfig)
    table = DecisionTable(version=3, scales=(12,))
    tables.put(table)
    tables.put(table)  # publishing the same version again is fine
    got = tables.get(3)
    assert got == table
    assert got.digest == table.digest
    assert tables.get(4) is None
    assert isinstance(tables, KubeTableStore)
    # another version in another slot leaves this one alone; the same slot replaces it
    other = DecisionTable(version=4, scales=(12,))
    tables.put(other)
    assert tables.get(3) == table
    assert tables.get(4) == other
    later = DecisionTable(version=3 + sidecar_objects.TABLE_SLOTS, scales=(12,))
    tables.put(later)
    assert tables.get(3) is None  # overwritten: never mistaken for version 3
    assert tables.get(later.version) == later

    a, b = Lease(lease_store, "a", 30), Lease(lease_store, "b", 30)
    assert a.step()
    assert not b.step()
    a.release()
    assert b.step()

    init_record(record, 256, ("a", "b"))
    ballots = kube_ballots(job, 2, cluster_kubeconfig)  # one ConfigMap: 2 pods
    coord = Coordinator(record, tables, ballots=ballots)
    assert coord.publish(table) == 1
    ep = coord.step()
    assert ep is not None
    assert ep.pending is not None
    for voter in ("a", "b"):  # each pod's vote: its own key of the ballot ConfigMap
        v = Vote(epoch=1, boundary=ep.pending.boundary, digest=table.digest, yes=True)
        ballots.cast(voter, Ballot(reported=256, needs=1, vote=v))
        coord.step()
    assert set(ballots.all()) == {"a", "b"}
    rec, _ = load_record(record)
    assert rec is not None
    assert rec.epochs[0].status == EpochStatus.COMMITTED
    assert rec.epochs[0].table_digest == table.digest

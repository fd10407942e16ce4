"""The chart's ``ingest.replicas`` (N replicas on PostgreSQL, one Lease for the learning loop)
and ``store.retention.rollupAfterHours``."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.unit.operator.test_chart import CHART, _flags, _helm, _ingest, _kind, _template

PG = ("store.urlSecret=store-url", "store.persistence.accessMode=ReadWriteMany")


def _ingest_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sa = _ingest(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    return [
        r
        for d in _kind(docs, "Role") + _kind(docs, "ClusterRole")
        if d["metadata"]["name"] == sa
        for r in d["rules"]
    ]


def test_one_replica_by_default_no_lease() -> None:
    docs = _template()
    ingest = _ingest(docs)
    assert ingest["spec"]["replicas"] == 1
    assert ingest["spec"]["strategy"] == {"type": "Recreate"}  # SQLite: one writer at a time
    assert not _flags(ingest, "--loop-lease")
    assert not any("leases" in r["resources"] for r in _ingest_rules(docs))


def test_replicas_elect_the_loop_with_a_lease_they_may_only_renew_by_name() -> None:
    docs = _template("ingest.replicas=4", *PG)
    ingest = _ingest(docs)
    assert ingest["spec"]["replicas"] == 4
    assert "strategy" not in ingest["spec"]  # rolling: the Service keeps answering
    (lease,) = _flags(ingest, "--loop-lease")
    env = ingest["spec"]["template"]["spec"]["containers"][0]["env"]
    pod_name = next(e for e in env if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    rules = [r for r in _ingest_rules(docs) if "leases" in r["resources"]]
    assert {tuple(r["verbs"]) for r in rules} == {("create",), ("get", "patch")}
    named = next(r for r in rules if "patch" in r["verbs"])
    assert named["resourceNames"] == [lease]
    (pvc,) = _kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize(
    ("sets", "why"),
    [
        (("ingest.replicas=2",), "PostgreSQL store"),
        (("ingest.replicas=2", "store.urlSecret=s"), "ReadWriteMany"),
        (("ingest.replicas=0",), "minimum"),
    ],
)
def test_replicas_without_what_they_need_are_refused(sets: tuple[str, ...], why: str) -> None:
    args = [_helm(), "template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode != 0
    assert why in res.stderr


def test_replicas_without_learning_need_no_shared_volume() -> None:
    docs = _template("ingest.replicas=3", "store.urlSecret=s", "learning.enabled=false")
    assert _ingest(docs)["spec"]["replicas"] == 3
    assert not _flags(_ingest(docs), "--loop-lease")


def test_the_rollup_reaches_the_ingest_and_can_be_turned_off() -> None:
    assert _flags(_ingest(_template()), "--rollup-after-hours") == ["1"]
    assert (
        _flags(_ingest(_template("store.retention.rollupAfterHours=0")), "--rollup-after-hours")
        == []
    )


def test_the_store_budget_reaches_each_replica() -> None:
    assert _flags(_ingest(_template()), "--rate-store") == []
    ingest = _ingest(
        _template("ingest.rateLimit.storeRecordsPerSecond=2750", "ingest.replicas=2", *PG)
    )
    assert _flags(ingest, "--rate-store") == ["2750"]

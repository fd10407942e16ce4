"""Per-job evidence read from the store (SQLite): what findings are judged on (issue 29)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.evidence import class_namespaces, guardrail_reverts, job_measures
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.features import record_features


def _rec(bucket: int, algo: str, origin: str, mean: float, count: int) -> dict[str, Any]:
    return {
        "collective": "allreduce", "size_bucket": bucket, "nbytes_min": 1 << bucket,
        "nbytes_max": 1 << bucket, "nranks": 32, "nnodes": 4, "algo": algo, "proto": "simple",
        "nchannels": 0, "chunk_bytes": 0, "origin": origin, "count": count,
        "mean_time_us": mean, "p50_time_us": mean, "p99_time_us": 1.1 * mean,
        "busbw_GBps": 1.0, "nccl_default_time_us": 100.0,
    }  # fmt: skip


def _job(store: ExperienceStore, ns: str, uid: str, records: list[dict[str, Any]], *,
         events: list[dict[str, Any]] | None = None, seq: int = 1) -> None:  # fmt: skip
    store.insert_batch(
        RewardBatch.model_validate(
            {
                "idempotency_key": f"pod-{uid}/{seq}",
                "job": {"namespace": ns, "kind": "PyTorchJob", "name": uid, "uid": uid},
                "pod": {"name": f"p-{uid}", "uid": f"pod-{uid}"},
                "model_version": "default",
                "table_version": 1,
                "records": records,
                "events": events or [],
            }
        )
    )
    record_features(store.backend, job_uid=uid, namespace=ns, job_name=uid,
                    hardware_class="h100", features={}, now=0.0)  # fmt: skip


def test_per_job_measures_of_the_asked_cells_and_the_reverts(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "e.db"))
    revert = {
        "kind": "guardrail_revert", "collective": "allreduce", "size_bucket": 25,
        "nbytes_min": 1 << 25, "nbytes_max": 1 << 25, "call_index": 9,
    }  # fmt: skip
    _job(store, "a", "j1", [_rec(25, "ring", "default", 100.0, 500),
                            _rec(25, "tree", "explore", 80.0, 20),
                            _rec(20, "ring", "default", 10.0, 500)])  # fmt: skip
    _job(store, "b", "j2", [_rec(25, "tree", "table", 80.0, 300)], events=[revert])
    _job(store, "b", "j2", [_rec(25, "tree", "table", 90.0, 100)], seq=2)
    got = {(m.job_uid, m.algo): m for m in job_measures(store.backend, [("allreduce", 25)])}
    assert set(got) == {("j1", "ring"), ("j1", "tree"), ("j2", "tree")}  # bucket 20: not asked
    j2 = got[("j2", "tree")]
    assert (j2.namespace, j2.calls, j2.table_calls, j2.own_calls) == ("b", 400, 400, 0)
    assert abs(j2.time_us - (300 * 80 + 100 * 90)) < 1e-6
    assert abs(j2.p99_over_p50 / j2.calls - 1.1) < 1e-9
    assert got[("j1", "ring")].own_calls == 500
    assert got[("j1", "ring")].first_id < j2.first_id
    assert job_measures(store.backend, []) == []
    assert guardrail_reverts(store.backend) == {("j2", "allreduce", 25)}
    assert class_namespaces(store.backend) == {"h100": 2}

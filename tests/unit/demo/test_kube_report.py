"""What `make demo-cluster` ends with: jobs until found, adopted, promoted; the cost bound."""

from __future__ import annotations

from dynamiccl.demo.harness_job import Played
from dynamiccl.demo.kube_report import format_row, outcome
from dynamiccl.demo.kube_sequence import JobResult
from dynamiccl.demo.surface import Departure

PLAYED = Played(calls=1000, batches=1, records=5, budget={}, stopped_exploring_at=None)


def _row(i: int, model: str, tree: bool, speedup: float, **kw: object) -> JobResult:
    return JobResult(i, f"train-{i:02d}", model, model != "default", tree, PLAYED,
                     speedup=speedup, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_outcome_counts_jobs_until_found_adopted_and_promoted() -> None:
    rows = [
        _row(1, "default", False, 0.99, explored_calls=250, cost_percent=0.7,
             found=["allreduce 32 MiB ring/simple x1.06"]),
        _row(2, "default", False, 1.0, found=["allreduce 128 MiB tree/simple x1.25"],
             events=["retraining v1 (Job's pod played here)"]),
        _row(3, "v1", True, 1.08, events=["canary v1"], measured=["allreduce/b25/32x4: tree"]),
        _row(4, "v1", True, 1.09, events=["promoted v1"], measured=["allreduce/b25/32x4: tree"]),
    ]  # fmt: skip
    res = outcome(rows, {"hardwareClasses": []}, Departure())
    assert (res.found_at, res.adopted_at, res.promoted_at) == (2, 3, 4)  # ring is not the finding
    assert res.max_cost_percent == 0.7
    assert res.best_speedup == 1.09
    lines = res.lines(Departure())
    assert "found by exploration: job 2 (tree measured faster)" in lines
    assert "every job starts with the class's finding from: job 3" in lines
    assert "canary" in format_row(rows[2], 30.0)


def test_nothing_found_nothing_adopted() -> None:
    rows = [_row(1, "default", False, 1.0), _row(2, "v1", False, 1.0)]
    res = outcome(rows, {}, None)
    assert (res.found_at, res.adopted_at, res.promoted_at) == (None, None, None)
    assert res.every_job_from is None
    assert res.best_speedup == 1.0

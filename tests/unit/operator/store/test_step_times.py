"""Step times in the experience store (issue 31.4): stored with their batch, read back per job,
pod and table version; refusals stored once and seen by the training reader.

Like test_experience.py, run again on PostgreSQL by
tests/integration/operator/test_store_postgres.py.
"""

from __future__ import annotations

from dynamiccl.api.experience import TRAINING_STEP_REFUSED, read_training_rows
from dynamiccl.api.rewards import RewardBatch, StepStatus, StepTimes
from dynamiccl.operator.store.steps import (
    Refusal,
    job_steps,
    record_refusals,
    refusals,
    version_cells,
)
from tests.unit.operator.store.experience_suite import (
    FakeClock,
    MakeStore,
    make_batch,
    make_store,
    rec,
    store_url,
)

__all__ = ["make_store", "store_url"]  # fixtures (test_store_postgres.py takes make_store)


def with_steps(
    b: RewardBatch, version: int, status: str = "found", n: int = 0, median: float = 0.0
) -> RewardBatch:
    steps = StepTimes(
        status=StepStatus(status),
        steps=n,
        median_us=median if n else None,
        spread_us=median / 100 if n else None,
    )
    return b.model_copy(update={"steps": steps, "table_version": version})


def test_step_times_are_stored_per_job_pod_and_table_version(make_store: MakeStore) -> None:
    s = make_store()
    seq = iter(range(1, 100))
    for pod in ("p0", "p1"):
        for version, n, median in ((1, 10, 1000.0), (1, 30, 1010.0), (2, 12, 1100.0)):
            s.insert_batch(with_steps(make_batch(next(seq), pod_uid=pod), version, n=n,
                                      median=median))  # fmt: skip
    s.insert_batch(make_batch(next(seq), pod_uid="p2"))  # a sender before issue 31
    s.insert_batch(with_steps(make_batch(next(seq), pod_uid="p2"), 2, "learning"))
    other = make_batch(next(seq), pod_uid="q0", job_uid="job-uid-1")
    s.insert_batch(with_steps(other, 1, n=50, median=5.0))
    got = job_steps(s.backend, "job-uid-0")
    assert got.status == {
        "p0": StepStatus.FOUND,
        "p1": StepStatus.FOUND,
        "p2": StepStatus.LEARNING,
    }
    latest = {(p.pod_uid, p.table_version): (p.steps, p.median_us) for p in got.versions}
    assert latest == {
        ("p0", 1): (30, 1010.0),
        ("p0", 2): (12, 1100.0),
        ("p1", 1): (30, 1010.0),
        ("p1", 2): (12, 1100.0),
    }
    assert {p.pod_uid for p in job_steps(s.backend, "job-uid-1").versions} == {"q0"}
    cells = version_cells(s.backend, "job-uid-0")
    assert {c.table_version for c in cells} == {1, 2}
    assert sum(c.calls for c in cells) == s.stored_calls("job-uid-0")


def test_a_retry_or_a_conflict_stores_no_second_step_row(make_store: MakeStore) -> None:
    s = make_store()
    b = with_steps(make_batch(1), 1, n=10, median=1000.0)
    s.insert_batch(b)
    assert s.insert_batch(b).duplicate
    forged = with_steps(make_batch(1), 1, n=10, median=2000.0)  # same key, other steps
    outs = s.insert_batches([forged])
    assert outs[0].__class__.__name__ == "IdempotencyConflict"
    (only,) = job_steps(s.backend, "job-uid-0").versions
    assert only.median_us == 1000.0


def _refusal(nch: int, version: int) -> Refusal:
    return Refusal(("allreduce", 20, 8, 1), ("ring", "simple", nch, 0), version, 0, 0.07, 1.3, 1, 1)


def test_refusals_keep_their_first_verdict_and_flag_the_jobs_training_rows(
    make_store: MakeStore, store_url: str
) -> None:
    s = make_store()
    s.insert_batch(make_batch(1, [rec(0), rec(8)]))  # ring/simple 0 and 1 channels, bucket 20
    s.insert_batch(make_batch(2, [rec(8)], pod_uid="q", job_uid="job-uid-1"))
    assert record_refusals(s.backend, "job-uid-0", "team-a", [_refusal(1, 3)], 10.0) == 1
    assert record_refusals(s.backend, "job-uid-0", "team-a", [_refusal(1, 5)], 11.0) == 0
    ((uid, r),) = refusals(s.backend)
    assert (uid, r.config, r.table_version) == ("job-uid-0", ("ring", "simple", 1, 0), 3)
    assert refusals(s.backend, "job-uid-1") == []
    rows = [row for page in read_training_rows(store_url) for row in page]
    flags = {(str(r[1]), int(r[10])): bool(r[TRAINING_STEP_REFUSED]) for r in rows}
    # only the refusing job's rows of the refused configuration
    assert flags == {("job-uid-0", 0): False, ("job-uid-0", 1): True, ("job-uid-1", 1): False}


def test_retention_drops_old_step_times(make_store: MakeStore) -> None:
    clock = FakeClock()
    s = make_store(clock=clock)
    s.insert_batch(with_steps(make_batch(1), 1, n=10, median=1000.0))
    record_refusals(s.backend, "job-uid-0", "team-a", [_refusal(1, 1)], clock())
    clock.t += 3 * 86_400.0
    s.insert_batch(with_steps(make_batch(2), 2, n=10, median=1000.0))
    res = s.apply_retention(max_age_s=2 * 86_400.0)
    assert (res.step_times, res.step_refusals) == (1, 1)
    assert [p.table_version for p in job_steps(s.backend, "job-uid-0").versions] == [2]


def test_a_store_of_schema_5_is_migrated_with_its_rows(make_store: MakeStore) -> None:
    old = make_store(migrate=False)
    old.migrate(target=5)
    old.insert_batch(make_batch(1))
    old.close()
    new = make_store()
    assert new.stored_calls() > 0
    assert job_steps(new.backend, "job-uid-0").versions == []
    new.insert_batch(with_steps(make_batch(2), 1, n=9, median=10.0))
    assert len(job_steps(new.backend, "job-uid-0").versions) == 1

"""The sidecar's cut interval (sidecar/pace.py): the job's size and the ingest's answers."""

from __future__ import annotations

import heapq

import pytest

from dynamiccl.sidecar.pace import JOB_BATCHES_PER_S, MAX_INTERVAL_S, Pace


@pytest.mark.parametrize(
    ("pods", "want_s"), [(1, 2.0), (8, 2.0), (200, 2.0), (2_000, 20.0), (12_500, 125.0)]
)
def test_a_jobs_pods_together_cut_at_most_the_job_rate(pods: int, want_s: float) -> None:
    p = Pace(2.0, pods)
    assert p.interval() == pytest.approx(want_s)
    assert pods / p.interval() <= max(JOB_BATCHES_PER_S, pods / 2.0)


def test_the_flag_is_a_floor_and_the_cap_holds() -> None:
    assert Pace(10.0, 8).interval() == 10.0
    assert Pace(2.0, 10**6).interval() == MAX_INTERVAL_S


def test_overload_answers_stretch_and_acknowledgements_relax() -> None:
    p = Pace(2.0, 8)
    p.observe(503, None)
    assert p.interval() == 4.0
    p.observe(429, 30.0)  # Retry-After longer than a doubling: at least that long
    assert p.interval() == 30.0
    for _ in range(40):
        p.observe(429, None)
    assert p.interval() == MAX_INTERVAL_S
    relaxed = [p.interval()]
    for _ in range(60):
        p.observe(200, None)
        relaxed.append(p.interval())
    assert relaxed == sorted(relaxed, reverse=True)
    assert relaxed[-1] == 2.0  # back to the job's own interval


@pytest.mark.parametrize("status", [0, 401, 403, 422])
def test_answers_that_say_nothing_about_load_change_nothing(status: int) -> None:
    p = Pace(2.0, 8)
    p.observe(503, None)
    p.observe(status, 9.0)
    assert p.interval() == 4.0


def test_senders_settle_at_what_the_ingest_stores() -> None:
    """1 000 sidecars (jobs of 8 pods) against an ingest that stores 100 batches/s and
    answers 503 to whatever is past that in each second: the offered rate falls from 500/s
    to about what is stored, and every second most batches are stored, not refused."""
    capacity = 100.0
    paces = [Pace(2.0, 8) for _ in range(1000)]
    due = [(i * 2.0 / 1000, i) for i in range(1000)]  # spread over one interval
    t, stored, refused = 0.0, 0, 0
    per_second: dict[int, int] = {}
    while t < 600:
        t, i = heapq.heappop(due)
        sec = int(t)
        per_second[sec] = per_second.get(sec, 0) + 1
        if per_second[sec] <= capacity:
            paces[i].observe(200, None)
            stored += 1 if t > 300 else 0
        else:
            paces[i].observe(503, 1.0)
            refused += 1 if t > 300 else 0
        heapq.heappush(due, (t + paces[i].interval(), i))
    assert stored / 300 == pytest.approx(capacity, rel=0.05)
    assert refused < stored / 2

"""Findings stand on several independent jobs, each measuring both arms itself (issue 29).

Pure: per-job measures as the store's `evidence.job_measures` returns them (its SQL is
tested in tests/unit/operator/store/test_evidence.py).
"""

from __future__ import annotations

from dynamiccl.api.learning import Finding
from dynamiccl.operator.learning.findings import Rules, findings
from dynamiccl.operator.store.evidence import JobMeasure

CLASS = "h100"
P99_OVER_P50 = 1.07  # about 3 % lognormal noise


def _m(job: str, algo: str, mean: float, calls: int, *, ns: str = "a", origin: str = "explore",
       order: int = 0, bucket: int = 25) -> JobMeasure:  # fmt: skip
    return JobMeasure(
        hardware_class=CLASS, namespace=ns, job_uid=job, nranks=32, nnodes=4,
        collective="allreduce", size_bucket=bucket, algo=algo, proto="simple", nchannels=0,
        chunk_bytes=0, calls=calls, time_us=mean * calls, nccl_default_us=100.0 * calls,
        p99_over_p50=P99_OVER_P50 * calls,
        own_calls=calls if origin == "default" else 0,
        table_calls=calls if origin == "table" else 0, first_id=order,
    )  # fmt: skip


def _job(job: str, tree_us: float, *, ns: str = "a", order: int = 0) -> list[JobMeasure]:
    """A job that ran ring as NCCL's own and explored tree (both arms in the job)."""
    return [
        _m(job, "ring", 100.0, 5000, ns=ns, origin="default", order=order),
        _m(job, "tree", tree_us, 40, ns=ns, order=order + 1),
    ]


def _tree(
    measures: list[JobMeasure],
    namespaces: int = 1,
    reverts: frozenset[tuple[str, str, int]] = frozenset(),
) -> Finding:
    got = findings(measures, set(reverts), {CLASS: namespaces}, Rules())
    (f,) = [f for f in got.get(CLASS, []) if f.algo == "tree"]
    return f


def test_one_job_is_never_a_finding_two_are() -> None:
    one = _tree(_job("j1", 80.0))
    assert one.supporting == 1
    assert not one.holds
    two = _tree(_job("j1", 80.0) + _job("j2", 81.0, order=10))
    assert two.holds
    assert two.supporting == 2
    assert (two.nccl_algo, two.nccl_proto) == ("ring", "simple")
    assert 1.22 < two.speedup < 1.26


def test_a_lying_job_with_huge_counts_is_still_one_job() -> None:
    """The attacker claims tree is 2x faster over 10^6 calls; one honest job measured it
    1.9x slower: no finding, and the honest word is the latest."""
    liar = [_m("liar", "ring", 100.0, 10**6, origin="default"), _m("liar", "tree", 50.0, 10**6)]
    f = _tree(liar + _job("honest", 190.0, order=10))
    assert not f.holds
    assert (f.supporting, f.contradicting) == (1, 1)


def test_a_job_without_nccls_own_arm_has_no_word() -> None:
    """Running tree as the table's choice with NCCL's pair never measured says nothing
    about tree against NCCL (its NCCL-default figure is an estimate, or made up)."""
    alone = [_m("j2", "tree", 10.0, 5000, origin="table", order=10)]
    assert _tree(_job("j1", 80.0) + alone).supporting == 1


def test_several_namespaces_are_needed_where_the_class_has_them() -> None:
    same_ns = _job("j1", 80.0, ns="team-a") + _job("j2", 80.0, ns="team-a", order=10)
    assert _tree(same_ns, namespaces=1).holds  # the class lives in one namespace
    assert not _tree(same_ns, namespaces=3).holds  # one tenant cannot make one alone
    mixed = _job("j1", 80.0, ns="team-a") + _job("j2", 80.0, ns="team-b", order=10)
    assert _tree(mixed, namespaces=3).holds


def test_a_finding_that_stops_holding_is_withdrawn() -> None:
    held = _job("j1", 80.0) + _job("j2", 80.0, order=10)
    assert _tree(held).holds
    # the surface changed back: the next job ran tree and measured it slower than ring
    changed = held + _job("j3", 120.0, order=20)
    f = _tree(changed)
    assert not f.holds
    assert f.contradicting == 1
    # two more jobs confirming it again: it holds again (the latest verdicts support it)
    back = changed + _job("j4", 80.0, order=30) + _job("j5", 80.0, order=40)
    assert _tree(back).holds


def test_a_guardrail_revert_while_running_it_contradicts() -> None:
    held = _job("j1", 80.0) + _job("j2", 80.0, order=10)
    runs = [_m("j3", "tree", 80.0, 500, origin="table", order=20)]
    assert _tree(held + runs).holds  # no word from j3: it never ran ring
    f = _tree(held + runs, reverts=frozenset({("j3", "allreduce", 25)}))
    assert not f.holds
    assert f.contradicting == 1


def test_within_the_noise_is_no_word() -> None:
    """3 % faster is inside the 5 % margin: neither support nor contradiction
    (a job measuring a real 5 % gain does not withdraw it by noise)."""
    f = _tree(_job("j1", 80.0) + _job("j2", 95.5, order=10))
    assert (f.supporting, f.contradicting) == (1, 0)

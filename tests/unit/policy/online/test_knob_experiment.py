"""The env-knob experiment: arms, the cross-job comparison, the assignment."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import (
    ArmResult,
    ArmState,
    CohortExperiment,
    EnvKnobExperiment,
    KnobName,
)
from dynamiccl.api.tuning_policy import EnvKnob, NCCLTuningPolicySpec
from dynamiccl.policy.online import knob_experiment as kx
from tests.topology_samples import dgx_h100, h100_job

NT, BS = KnobName.NCCL_NTHREADS, KnobName.NCCL_BUFFSIZE
KNOBS = [
    EnvKnob(name=NT, allowed=[256, 512], default=512),
    EnvKnob(name=BS, allowed=[4 << 20, 8 << 20]),
]
BUCKETS = [("allreduce", b, 16, 2) for b in (10, 16, 20, 24)] + [("allgather", 20, 16, 2)]


def _spec(mode: str = "learned", percent: int = 10) -> NCCLTuningPolicySpec:
    return NCCLTuningPolicySpec.model_validate(
        {
            "mode": mode,
            "constraints": {"envKnobs": [k.model_dump(by_alias=True) for k in KNOBS]},
            "exploration": {"envKnobJobPercent": percent},
        }
    )


def _jobs(
    arm: kx.Arm, n: int, factor: float, rng: random.Random, tag: str
) -> list[kx.JobBucketTime]:
    """`n` jobs of an arm whose every bucket takes `factor` x the baseline, 3 % job noise."""
    rows = []
    for j in range(n):
        noise = rng.lognormvariate(0.0, 0.03)
        for i, b in enumerate(BUCKETS):
            t = 100.0 * (i + 1) * factor * noise * rng.lognormvariate(0.0, 0.01)
            rows.append(kx.JobBucketTime(f"{tag}-{j}", b, 50, t))
    return rows


def _arm(**set_: int) -> kx.Arm:
    return tuple(sorted(((KnobName(k), v) for k, v in set_.items()), key=lambda kv: kv[0].value))


def test_arms_are_the_baseline_then_one_knob_deviations() -> None:
    got = [kx.arm_key(a) for a in kx.arms(KNOBS)]
    assert got == [
        "NCCL_NTHREADS=512",
        "NCCL_NTHREADS=256",
        "NCCL_BUFFSIZE=4194304,NCCL_NTHREADS=512",
        "NCCL_BUFFSIZE=8388608,NCCL_NTHREADS=512",
    ]
    assert kx.arms([]) == [()]


def test_a_faster_arm_is_better_a_slower_one_worse_an_equal_one_undecided() -> None:
    rng = random.Random(1)
    cands = kx.arms(KNOBS)
    n = 10
    job_arm: dict[str, str] = {}
    rows = []
    for tag, arm, factor in (
        ("b", cands[0], 1.0),
        ("f", cands[1], 0.9),
        ("s", cands[2], 1.1),
        ("e", cands[3], 1.0),
    ):
        rows += _jobs(arm, n, factor, rng, tag)
        job_arm |= {f"{tag}-{j}": kx.arm_key(arm) for j in range(n)}
    base, fast, slow, same = kx.evaluate(cands, job_arm, rows)
    assert base.state is ArmState.BASELINE
    assert base.jobs == n
    assert fast.state is ArmState.BETTER
    assert fast.jobs == n
    assert fast.low is not None
    assert fast.high is not None
    assert fast.speedup is not None
    assert fast.low < 1 / 0.9 < fast.high
    assert fast.low > 1.0
    assert slow.state is ArmState.WORSE
    assert slow.high is not None
    assert slow.high < 1.0
    assert same.state is ArmState.EXPLORING
    assert same.low is not None
    assert same.low < 1.0
    entry = kx.experiment("c-x", "d", cands, [base, fast, slow, same])
    assert entry.adopted is not None
    assert kx.arm_of(entry.adopted) == cands[1]


def test_few_jobs_give_a_speedup_but_no_verdict() -> None:
    rng = random.Random(2)
    cands = kx.arms(KNOBS)
    rows = _jobs(cands[0], 2, 1.0, rng, "b") + _jobs(cands[1], 2, 0.8, rng, "f")
    job_arm = {f"b-{j}": kx.arm_key(cands[0]) for j in range(2)}
    job_arm |= {f"f-{j}": kx.arm_key(cands[1]) for j in range(2)}
    res = kx.evaluate(cands, job_arm, rows)
    assert res[1].speedup == pytest.approx(1.25, rel=0.05)
    assert res[1].state is ArmState.EXPLORING
    assert res[1].low is None
    assert [r.jobs for r in res[2:]] == [0, 0]


def test_only_shared_buckets_count_and_scales_are_not_mixed() -> None:
    cands = kx.arms(KNOBS)
    base = kx.arm_key(cands[0])
    rows = [
        kx.JobBucketTime("b1", ("allreduce", 20, 16, 2), 10, 100.0),
        kx.JobBucketTime("b2", ("allreduce", 20, 16, 2), 10, 100.0),
        # another scale: no baseline there, ignored
        kx.JobBucketTime("x1", ("allreduce", 20, 64, 8), 10, 10.0),
        kx.JobBucketTime("x1", ("allreduce", 20, 16, 2), 10, 50.0),
    ]
    res = kx.evaluate(cands, {"b1": base, "b2": base, "x1": kx.arm_key(cands[1])}, rows)
    assert res[1].jobs == 1
    assert res[1].speedup == pytest.approx(2.0)
    assert res[0].jobs == 2
    assert res[0].speedup == pytest.approx(1.0)


def test_other_modes_and_zero_percent_get_the_declared_defaults() -> None:
    for spec in (_spec("static"), _spec("learned", 0)):
        for uid in ("a", "b", "c"):
            got = kx.assign(spec, None, "c-x", uid)
            assert got.env == {"NCCL_NTHREADS": "512"}
            assert got.reason == "declared defaults"


def _adopting_256(*others: ArmResult) -> CohortExperiment:
    """Cohort c-x where 256 threads measured 1.08x (1.04-1.12) over the declared 512."""
    cands = kx.arms(KNOBS)
    better = ArmResult(
        knobs=kx.knob_values(cands[1]),
        jobs=9,
        speedup=1.08,
        low=1.04,
        high=1.12,
        state=ArmState.BETTER,
    )
    base = ArmResult(knobs=kx.knob_values(cands[0]), jobs=9, state=ArmState.BASELINE)
    return kx.experiment("c-x", "d", cands, [base, better, *others])


def test_nothing_is_explored_where_no_learning_loop_evaluates() -> None:
    spec = _spec(percent=50)
    got = {kx.assign(spec, None, "c-x", f"u{i}", evaluated=False).arm for i in range(200)}
    assert got == {"NCCL_NTHREADS=512"}
    assert "no learning loop" in kx.assign(spec, None, "c-x", "u", evaluated=False).reason
    # a value adopted while a loop ran is still used
    entry = _adopting_256()
    got = {kx.assign(spec, entry, "c-x", f"u{i}", evaluated=False).arm for i in range(200)}
    assert got == {"NCCL_NTHREADS=256"}


def test_an_experiment_no_loop_has_rewritten_for_days_is_abandoned() -> None:
    exp = EnvKnobExperiment(updated="2026-11-20T00:00:00Z")
    stamp = exp.updated_unix_s
    assert stamp is not None
    assert kx.is_live(exp, stamp + kx.STALE_AFTER_S)
    assert not kx.is_live(exp, stamp + kx.STALE_AFTER_S + 1)
    assert kx.is_live(exp, None)  # the time is not known: trust it
    assert kx.is_live(EnvKnobExperiment(updated="yesterday"), stamp)


def test_the_assignment_explores_the_declared_share_and_then_uses_the_adopted_arm() -> None:
    spec = _spec(percent=10)
    cands = kx.arms(KNOBS)
    uids = [f"uid-{i}" for i in range(4000)]
    counts = Counter(kx.assign(spec, None, "c-x", u).arm for u in uids)
    explored = sum(v for k, v in counts.items() if k != kx.arm_key(cands[0]))
    # 10 % explore, spread over 4 arms (the baseline among them): 3/4 of them leave it
    assert 0.06 < explored / len(uids) < 0.09
    assert set(counts) == {kx.arm_key(a) for a in cands}
    assert kx.assign(spec, None, "c-x", "uid-7") == kx.assign(spec, None, "c-x", "uid-7")

    entry = _adopting_256(
        ArmResult(knobs=kx.knob_values(cands[2]), jobs=9, state=ArmState.WORSE),
        ArmResult(knobs=kx.knob_values(cands[3]), jobs=20, state=ArmState.NO_EFFECT),
    )
    got = Counter(kx.assign(spec, entry, "c-x", u).arm for u in uids)
    assert kx.arm_key(cands[2]) not in got
    assert kx.arm_key(cands[3]) not in got
    # explorers go to the arms still open (here only the baseline), the rest to the adopted one
    assert got[kx.arm_key(cands[1])] > 0.85 * len(uids)
    assert got[kx.arm_key(cands[0])] + got[kx.arm_key(cands[1])] == len(uids)
    reason = kx.assign(spec, entry, "c-x", "uid-1").reason
    assert "1.080x" in reason or "exploring" in reason


def test_an_adopted_arm_the_policy_no_longer_allows_is_not_used() -> None:
    spec = _spec(percent=0)
    stale = CohortExperiment(
        cohort="c-x",
        arms=[ArmResult(knobs=kx.knob_values(_arm(NCCL_NTHREADS=128)), state=ArmState.BETTER)],
        adopted=kx.knob_values(_arm(NCCL_NTHREADS=128)),
    )
    assert kx.assign(spec, stale, "c-x", "u").env == {"NCCL_NTHREADS": "512"}
    spec = _spec(percent=1)
    assert all(
        kx.assign(spec, stale, "c-x", f"u{i}").env.get("NCCL_NTHREADS") != "128" for i in range(300)
    )


def test_the_cohort_is_the_hardware_class_not_the_scale() -> None:
    two = StateFeatures.model_validate(h100_job(2))
    eight = StateFeatures.model_validate(h100_job(8, name="big"))
    a100 = StateFeatures.model_validate(
        h100_job(2) | {"topology": dgx_h100("a", 2, gpu="A100", nvls=False)}
    )
    assert kx.cohort_of(two)[0] == kx.cohort_of(eight)[0]
    assert kx.cohort_of(two)[0] != kx.cohort_of(a100)[0]
    assert kx.cohort_of(two)[1] == "H100 x8 nvswitch+nvls, infiniband 8x400G"


def test_an_arm_without_effect_stops_being_explored_after_enough_jobs() -> None:
    rng = random.Random(4)
    cands = kx.arms(KNOBS)
    n = kx.MAX_JOBS
    rows = _jobs(cands[0], n, 1.0, rng, "b") + _jobs(cands[1], n, 1.0, rng, "e")
    job_arm = {f"b-{j}": kx.arm_key(cands[0]) for j in range(n)}
    job_arm |= {f"e-{j}": kx.arm_key(cands[1]) for j in range(n)}
    res = kx.evaluate(cands, job_arm, rows)[1]
    assert res.state is ArmState.NO_EFFECT
    assert res.low is not None
    assert res.high is not None
    assert res.low < 1.0 < res.high


QPS, SOCK = KnobName.NCCL_IB_QPS_PER_CONNECTION, KnobName.NCCL_SOCKET_NTHREADS
NET_KNOBS = [
    EnvKnob(name=QPS, allowed=[1, 4], default=1),
    EnvKnob(name=SOCK, allowed=[1, 4, 8], default=1),
]


def test_a_skipped_knob_keeps_its_default_in_every_arm_and_has_no_arm_of_its_own() -> None:
    got = [kx.arm_key(a) for a in kx.arms(NET_KNOBS, {SOCK: "not here"})]
    assert got == [
        "NCCL_IB_QPS_PER_CONNECTION=1,NCCL_SOCKET_NTHREADS=1",
        "NCCL_IB_QPS_PER_CONNECTION=4,NCCL_SOCKET_NTHREADS=1",
    ]
    entry = kx.experiment("c-x", "d", [], [], {SOCK: "the socket transport's"})
    assert [(s.name, s.reason) for s in entry.skipped] == [(SOCK, "the socket transport's")]


def test_a_job_never_explores_a_skipped_knob_and_is_told_why() -> None:
    spec = NCCLTuningPolicySpec.model_validate(
        {
            "constraints": {"envKnobs": [k.model_dump(by_alias=True) for k in NET_KNOBS]},
            "exploration": {"envKnobJobPercent": 100},
        }
    )
    skip = {SOCK: "NCCL's socket transport's; this class's fabric is infiniband"}
    got = [kx.assign(spec, None, "c-ib", f"u{i}", skip=skip) for i in range(300)]
    assert {a.env["NCCL_SOCKET_NTHREADS"] for a in got} == {"1"}
    assert {a.env["NCCL_IB_QPS_PER_CONNECTION"] for a in got} == {"1", "4"}
    assert all(a.reason.endswith(f"; not tried: NCCL_SOCKET_NTHREADS ({skip[SOCK]})") for a in got)
    # without the skip the same jobs try every socket value
    free = {kx.assign(spec, None, "c-ib", f"u{i}").env["NCCL_SOCKET_NTHREADS"] for i in range(300)}
    assert free == {"1", "4", "8"}

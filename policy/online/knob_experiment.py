"""Per-job env knobs learned across jobs: arms, the comparison, and the assignment.

NCCL reads `NCCL_NTHREADS`, `NCCL_BUFFSIZE`, `NCCL_MIN_NCHANNELS`,
`NCCL_MAX_NCHANNELS` and the network knobs (`KnobName`) once, at init, so a
job measures one value of each. No
published measurement shows NCCL's defaults for them wrong on a system class
the simulator models (docs/simulator.md §4), so the simulator cannot choose
them; real jobs can. This module is the experiment, without I/O:

- `arms`: the policy's declared defaults (the *baseline*) and every one-knob
  deviation to another allowed value, except for knobs that cannot matter on
  the hardware class (knob_scope.py: e.g. the IB transport's on a TCP fabric);
- `cohort_of`: jobs are compared only with jobs on the same hardware class
  (GPU, node shape, interconnect, NICs, fabric, container split);
- `evaluate`: each job's speedup over the baseline is the time-weighted
  geometric mean, over the (collective, size bucket, ranks, nodes) buckets it
  shares with baseline jobs, of baseline time / its time (baseline jobs
  leave-one-out, so their own spread is measured too); an arm's speedup is the
  geometric mean over its jobs, with a Welch interval (Student's t) against
  the baseline's that holds for every arm at every re-evaluation at once
  (policy/online/sequential.py: 95 % simultaneous over the arms and every job
  count); `better` when the whole interval is above 1 (and the speedup is at
  least 1 %), `worse` when it is below 1 (never assigned again),
  `no-effect` after 40 jobs without either (no longer explored);
- `assign`: a stable hash of the job uid sends `exploration.envKnobJobPercent`
  of a `learned` policy's jobs to an arm still under test (0: no new
  experiments); every other job gets the adopted arm (the `better` one with
  the highest lower bound) or the baseline. Other modes get the declared
  defaults, as before.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import (
    ArmResult,
    ArmState,
    CohortExperiment,
    EnvKnobExperiment,
    KnobName,
    KnobValue,
    SkippedKnob,
)
from dynamiccl.api.tuning_policy import EnvKnob, Mode, NCCLTuningPolicySpec
from dynamiccl.policy.online.knob_scope import skip_text
from dynamiccl.policy.online.sequential import simultaneous_t, welch_df
from dynamiccl.policy.online.stats import mean_var, stable_hash64

MIN_JOBS: Final = 5  # per arm and for the baseline before an interval is computed
MAX_JOBS: Final = 40  # an arm this well measured without a verdict has no effect
MIN_GAIN: Final = 0.01  # a `better` arm is at least 1 % faster
STALE_AFTER_S: Final = 3 * 24 * 3600.0  # the loop rewrites the status daily: it is gone
ALPHA: Final = 0.05  # chance, per cohort, that any interval ever excludes its arm's true value

Arm = tuple[tuple[KnobName, int], ...]  # the set knobs, sorted by name; () = all NCCL's own


def arm_key(arm: Arm) -> str:
    """Canonical text of an arm ("" = every knob left to NCCL)."""
    return ",".join(f"{k.value}={v}" for k, v in arm)


def arm_of(values: Sequence[KnobValue]) -> Arm:
    """An arm from its status form."""
    return tuple(sorted(((v.name, v.value) for v in values), key=lambda kv: kv[0].value))


def knob_values(arm: Arm) -> list[KnobValue]:
    """The status form of an arm."""
    return [KnobValue(name=k, value=v) for k, v in arm]


def baseline(knobs: Sequence[EnvKnob]) -> Arm:
    """The declared defaults (knobs without one are left to NCCL)."""
    return arm_of([KnobValue(name=k.name, value=k.default) for k in knobs if k.default is not None])


def arms(knobs: Sequence[EnvKnob], skip: Collection[KnobName] = ()) -> list[Arm]:
    """The baseline, then each one-knob deviation to another allowed value (none for the
    knobs in `skip`: they cannot matter where the arms are tried; knob_scope.py)."""
    base = dict(baseline(knobs))
    out = [baseline(knobs)]
    for k in knobs:
        if k.name in skip:
            continue
        for v in k.allowed:
            if base.get(k.name) == v:
                continue
            out.append(tuple(sorted({**base, k.name: v}.items(), key=lambda kv: kv[0].value)))
    return list(dict.fromkeys(out))


def cohort_of(features: StateFeatures) -> tuple[str, str]:
    """(id, description) of the job's hardware class; the scale is not part of it."""
    t = features.topology
    shape = {
        "gpu": t.gpu,
        "gpus_per_node": t.gpus_per_node,
        "intra": t.intra.value,
        "nvlink_GBps": t.nvlink_GBps,
        "nvls": t.nvls,
        "pcie_gen": t.pcie_gen,
        "nics_per_node": t.nics_per_node,
        "nic_Gbps": t.nic_Gbps,
        "fabric": t.fabric.value,
        "sharp": t.sharp,
        "container_boundary": features.environment.container_boundary,
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]
    nic = f"{t.fabric.value} {t.nics_per_node}x{t.nic_Gbps:g}G" if t.nics_per_node else "no NIC"
    split = ", container split" if features.environment.container_boundary else ""
    desc = f"{t.gpu} x{t.gpus_per_node} {t.intra.value}{'+nvls' if t.nvls else ''}, {nic}{split}"
    return f"c-{digest}", desc


@dataclass(frozen=True)
class JobBucketTime:
    """A job's measured time in one bucket (aggregated over its pods and records)."""

    job_uid: str
    bucket: tuple[str, int, int, int]  # (collective, size bucket, nranks, nnodes)
    calls: int
    mean_time_us: float


def _job_speedups(
    rows: Sequence[JobBucketTime], job_arm: Mapping[str, str], base_key: str
) -> dict[str, float]:
    """log speedup of every job over the baseline (baseline jobs leave-one-out)."""
    base_logs: dict[tuple[str, int, int, int], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if job_arm.get(r.job_uid) == base_key and r.mean_time_us > 0:
            base_logs[r.bucket][r.job_uid] = math.log(r.mean_time_us)
    num: dict[str, float] = defaultdict(float)
    den: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.job_uid not in job_arm or r.mean_time_us <= 0 or r.calls <= 0:
            continue
        others = [x for j, x in base_logs.get(r.bucket, {}).items() if j != r.job_uid]
        if not others:
            continue
        weight = r.calls * r.mean_time_us
        num[r.job_uid] += weight * (sum(others) / len(others) - math.log(r.mean_time_us))
        den[r.job_uid] += weight
    return {j: num[j] / den[j] for j in num if den[j] > 0}


def evaluate(
    candidates: Sequence[Arm], job_arm: Mapping[str, str], rows: Sequence[JobBucketTime]
) -> list[ArmResult]:
    """Each arm's measured outcome against the baseline (`candidates[0]`)."""
    base_key = arm_key(candidates[0])
    logs = _job_speedups(rows, job_arm, base_key)
    by_arm: dict[str, list[float]] = defaultdict(list)
    for job, value in sorted(logs.items()):
        by_arm[job_arm[job]].append(value)
    base = by_arm.get(base_key, [])
    out = [
        ArmResult(
            knobs=knob_values(candidates[0]),
            jobs=len(base),
            speedup=math.exp(mean_var(base)[0]) if base else None,
            state=ArmState.BASELINE,
        )
    ]
    for arm in candidates[1:]:
        out.append(_compare(arm, by_arm.get(arm_key(arm), []), base, len(candidates) - 1))
    return out


def _compare(arm: Arm, xs: Sequence[float], base: Sequence[float], deviations: int) -> ArmResult:
    """One arm's jobs (log speedups) against the baseline's."""
    if not xs or not base:
        return ArmResult(knobs=knob_values(arm), jobs=len(xs))
    (m, v), (mb, vb) = mean_var(xs), mean_var(base)
    diff = m - mb
    if len(xs) < MIN_JOBS or len(base) < MIN_JOBS:
        return ArmResult(knobs=knob_values(arm), jobs=len(xs), speedup=math.exp(diff))
    se2, se2_b = v / len(xs), vb / len(base)
    df = welch_df(se2, len(xs), se2_b, len(base))
    # looks are counted by the arm's jobs: it gets new jobs rarely, the baseline often, and a
    # look changes materially only with a new job of the arm
    half = simultaneous_t(len(xs), df, deviations, ALPHA) * math.sqrt(se2 + se2_b)
    low, high = math.exp(diff - half), math.exp(diff + half)
    state = ArmState.EXPLORING
    if low > 1.0 and math.exp(diff) >= 1.0 + MIN_GAIN:
        state = ArmState.BETTER
    elif high < 1.0:
        state = ArmState.WORSE
    elif len(xs) >= MAX_JOBS:
        state = ArmState.NO_EFFECT
    return ArmResult(
        knobs=knob_values(arm),
        jobs=len(xs),
        speedup=math.exp(diff),
        low=low,
        high=high,
        state=state,
    )


def experiment(
    cohort: str,
    description: str,
    candidates: Sequence[Arm],
    results: Sequence[ArmResult],
    skipped: Mapping[KnobName, str] | None = None,
) -> CohortExperiment:
    """The status entry of one cohort: the results, the arm adopted, if any, and the
    knobs not tried on it (with the reason)."""
    better = [r for r in results if r.state is ArmState.BETTER]
    best = max(better, key=lambda r: r.low or 0.0, default=None)
    return CohortExperiment(
        cohort=cohort,
        description=description,
        arms=list(results),
        adopted=best.knobs if best is not None else None,
        skipped=[SkippedKnob(name=k, reason=why) for k, why in (skipped or {}).items()],
    )


def is_live(experiment: EnvKnobExperiment, now_unix_s: float | None) -> bool:
    """Was the experiment written recently enough that a learning loop still runs it?

    The loop rewrites it at least daily (operator/learning/knob_loop.py); after
    STALE_AFTER_S without, no new job explores. `now_unix_s` None (unknown) or
    an unreadable stamp: live.
    """
    stamp = experiment.updated_unix_s
    if now_unix_s is None or stamp is None:
        return True
    return now_unix_s - stamp <= STALE_AFTER_S


@dataclass(frozen=True)
class Assignment:
    """The env a job's NCCL ranks get, and why."""

    env: dict[str, str]
    arm: str  # arm_key
    reason: str


def _unit(*parts: str) -> float:
    """A stable number in [0, 1) from the parts."""
    return stable_hash64(*parts) / 2.0**64


def _assignment(arm: Arm, reason: str) -> Assignment:
    return Assignment({k.value: str(v) for k, v in arm}, arm_key(arm), reason)


def assign(
    spec: NCCLTuningPolicySpec,
    entry: CohortExperiment | None,
    cohort: str,
    job_uid: str,
    *,
    evaluated: bool = True,
    skip: Mapping[KnobName, str] | None = None,
) -> Assignment:
    """The knob values for one job of `cohort` (stable for the job's uid).

    `evaluated`: a learning loop publishes this policy's experiment (its
    status has a recent `envKnobs`). Without one nobody would compare the
    jobs, so nothing is explored; a value adopted earlier is still used.
    `skip`: knobs whose other values cannot matter for this job, with the
    reason (knob_scope.job_skips): never explored here, the reason is told.
    """
    got = _assign(spec, entry, cohort, job_uid, evaluated=evaluated, skip=skip or {})
    if skip and spec.mode is Mode.LEARNED:
        return Assignment(got.env, got.arm, f"{got.reason}; {skip_text(dict(skip))}")
    return got


def _assign(
    spec: NCCLTuningPolicySpec,
    entry: CohortExperiment | None,
    cohort: str,
    job_uid: str,
    *,
    evaluated: bool,
    skip: Mapping[KnobName, str],
) -> Assignment:
    knobs = spec.constraints.env_knobs
    candidates = arms(knobs)
    percent = spec.exploration.env_knob_job_percent
    if spec.mode is not Mode.LEARNED or len(candidates) == 1:
        return _assignment(candidates[0], "declared defaults")
    results = {arm_key(arm_of(r.knobs)): r for r in (entry.arms if entry else [])}
    if evaluated and _unit(job_uid, cohort, "explore") * 100 < percent:
        open_arms = [
            a
            for a in arms(knobs, skip)
            if arm_key(a) not in results
            or results[arm_key(a)].state in (ArmState.BASELINE, ArmState.EXPLORING)
        ]
        if open_arms:
            arm = open_arms[int(_unit(job_uid, cohort, "arm") * len(open_arms))]
            return _assignment(
                arm, f"exploring knobs {arm_key(arm) or 'NCCL defaults'} in cohort {cohort}"
            )
    if entry is not None and entry.adopted is not None:
        adopted = arm_of(entry.adopted)
        r = results.get(arm_key(adopted))
        if adopted in candidates and r is not None and r.state is ArmState.BETTER:
            return _assignment(
                adopted,
                f"adopted in cohort {cohort}: {r.speedup:.3f}x over the declared defaults "
                f"(95 % interval {r.low:.3f}-{r.high:.3f}, {r.jobs} jobs)",
            )
    if not evaluated:
        return _assignment(
            candidates[0], "declared defaults (no learning loop evaluates this policy's envKnobs)"
        )
    return _assignment(candidates[0], "declared defaults")

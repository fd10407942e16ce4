"""Canary, promotion and rollback of model versions — pure decisions, no I/O.

Which version a new job gets (the canary for `canaryPercent` % of new jobs, counted) is the
operator's decision, `operator/controller/policy_match.choose_model`.

* `judge`: compares the canary's jobs with the promoted version's jobs of the same
  hardware classes (`paired`) by their measured speedup over NCCL's default
  (`JobOutcome` from the store, exploration calls excluded). Each job is one sample (its
  speedup's log); the canary is promoted when its mean log-speedup beats the baseline's
  by more than the margin and the confidence bound agrees, rolled back when it is worse
  by more than the margin with the same confidence, otherwise we wait. The bound holds
  over every re-judgement at once (`Criteria.alpha`, policy/online/sequential.py): the
  loop judges again at every tick, and a fixed 95 % bound would, over enough ticks,
  promote or roll back a canary no different from the promoted model. Without any
  baseline job the baseline is NCCL's default itself (speedup 1). Per cell as well
  (issue 29): a canary whose jobs ran some cell slower than the baseline's jobs, beyond
  the margin and the same kind of bound (`slower_cells`), is rolled back, whatever it
  gains elsewhere: a gain in some cells must not hide a loss in another. Where the
  canary's jobs measured both versions' choices inside themselves (their arms, issue 29:
  operator/learning/within_job.py), those comparisons decide instead: they carry no
  difference between jobs, so fewer jobs suffice.
* `ALLOWED_TRANSITIONS`: the registry's status machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from dynamiccl.api.registry import ModelStatus
from dynamiccl.operator.learning import within_job
from dynamiccl.operator.learning.within_job import PairedJob
from dynamiccl.operator.store.evidence import CellOutcome
from dynamiccl.operator.store.summary import JobOutcome
from dynamiccl.policy.online.sequential import simultaneous_t, simultaneous_z, welch_df
from dynamiccl.policy.online.stats import mean_var

ALLOWED_TRANSITIONS: Final[dict[ModelStatus, frozenset[ModelStatus]]] = {
    ModelStatus.CANDIDATE: frozenset(
        {ModelStatus.CANARY, ModelStatus.PROMOTED, ModelStatus.ROLLED_BACK}
    ),
    ModelStatus.CANARY: frozenset({ModelStatus.PROMOTED, ModelStatus.ROLLED_BACK}),
    ModelStatus.PROMOTED: frozenset({ModelStatus.RETIRED}),
    ModelStatus.RETIRED: frozenset({ModelStatus.PROMOTED}),  # manual roll-back to it
    ModelStatus.ROLLED_BACK: frozenset(),
}


def can_transition(src: ModelStatus, dst: ModelStatus) -> bool:
    """Whether the registry may move a version from `src` to `dst`."""
    return dst in ALLOWED_TRANSITIONS[src]


class Verdict(StrEnum):
    """What to do with the canary now."""

    WAIT = "wait"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class Criteria:
    """How much evidence a verdict needs."""

    min_calls_per_job: int = 100  # a job counts once it measured this many calls
    min_jobs_promote: int = 3
    min_jobs_rollback: int = 2  # rolling back needs less evidence than promoting
    margin: float = 0.02  # relative speedup difference that matters (2 %)
    # chance that any verdict over the canary's life rests on a wrong bound: the loop
    # judges again at every tick, so the bound widens with the jobs (policy/online/sequential.py)
    alpha: float = 0.05
    fixed_z: float | None = None  # a fixed bound quantile instead (the old rule, 1.645)


@dataclass(frozen=True)
class Judgement:
    """A verdict with the numbers that led to it."""

    verdict: Verdict
    canary_jobs: int
    baseline_jobs: int
    canary_speedup: float | None  # geometric mean over jobs
    baseline_speedup: float | None
    reason: str
    paired_jobs: int = 0  # canary jobs compared inside themselves (within_job.py)
    paired_gain: float | None = None  # their mean: promoted's time / canary's (> 1: faster)


def _log_stats(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and squared standard error of the mean of log-speedups."""
    mean, var = mean_var(xs)
    return mean, var / len(xs)


def _samples(outcomes: Sequence[JobOutcome], version: str, c: Criteria) -> dict[str, list[float]]:
    """Log-speedups of the version's jobs with enough calls, by hardware class."""
    out: dict[str, list[float]] = {}
    for o in outcomes:
        if o.model_version == version and o.calls >= c.min_calls_per_job and o.speedup > 0:
            out.setdefault(o.hardware_class, []).append(math.log(o.speedup))
    return out


@dataclass(frozen=True)
class _Side:
    """One side of a class-paired comparison: weighted mean, squared standard error, jobs and
    degrees of freedom of its pooled within-class variance."""

    mean: float
    se2: float
    n: int
    dof: int


def _side(by_class: dict[str, list[float]], weights: dict[str, float]) -> _Side:
    """Sum over classes of weight x class mean; the within-class variance pooled over the
    classes (0 without a degree of freedom: a single job is taken as exact, as before)."""
    means = {k: sum(xs) / len(xs) for k, xs in by_class.items()}
    n = sum(len(xs) for xs in by_class.values())
    dof = n - len(by_class)
    ss = sum(sum((x - means[k]) ** 2 for x in xs) for k, xs in by_class.items())
    var = ss / dof if dof > 0 else 0.0
    mean = sum(w * means[k] for k, w in weights.items())
    se2 = sum(w * w * var / len(by_class[k]) for k, w in weights.items())
    return _Side(mean, se2, n, dof)


def paired(cs: dict[str, list[float]], bs: dict[str, list[float]]) -> tuple[_Side, _Side | None]:
    """The canary's and the baseline's sides, compared within hardware classes: only the
    classes both sides' jobs ran in, each weighted by its share of the canary's jobs there
    (the canary's average effect over its own jobs). Without baseline jobs the baseline is
    NCCL's default (None), against every canary job. One class: the plain two-sample means."""
    if not bs:
        return _side(cs, {k: len(v) / sum(map(len, cs.values())) for k, v in cs.items()}), None
    shared = {k: cs[k] for k in cs if k in bs}
    total = sum(len(v) for v in shared.values())
    weights = {k: len(v) / total for k, v in shared.items()} if total else {}
    return _side(shared, weights), _side({k: bs[k] for k in shared}, weights)


def _cell_samples(cells: Sequence[CellOutcome], version: str, c: Criteria) -> dict[
    tuple[str, int, int, int], list[float]
]:  # fmt: skip
    out: dict[tuple[str, int, int, int], list[float]] = {}
    for o in cells:
        if o.model_version == version and o.calls >= c.min_calls_per_job and o.time_us > 0:
            out.setdefault(o.cell, []).append(math.log(o.time_us / o.calls))
    return out


def slower_cells(
    cells: Sequence[CellOutcome], *, canary: str, baseline: str, criteria: Criteria = Criteria()
) -> list[str]:
    """Cells the canary's jobs ran slower than the baseline's, by more than the margin and
    with the rollback bound (normal quantile, the error budget split over the cells too),
    each side with `min_jobs_rollback` jobs that ran the cell."""
    cs, bs = _cell_samples(cells, canary, criteria), _cell_samples(cells, baseline, criteria)
    both = [k for k in cs if len(cs[k]) >= criteria.min_jobs_rollback
            and len(bs.get(k, ())) >= criteria.min_jobs_rollback]  # fmt: skip
    out = []
    for k in sorted(both):
        (c_mean, c_se2), (b_mean, b_se2) = _log_stats(cs[k]), _log_stats(bs[k])
        z = criteria.fixed_z or simultaneous_z(len(cs[k]), len(both), criteria.alpha)
        slower = c_mean - b_mean  # log time: > 0 is slower
        if slower > math.log1p(criteria.margin) and slower - z * math.sqrt(c_se2 + b_se2) > 0:
            out.append(f"{k[0]}/b{k[1]}/{k[2]}x{k[3]} {(math.exp(slower) - 1) * 100:.1f}%")
    return out


def judge(
    outcomes: Sequence[JobOutcome],
    *,
    canary: str,
    baseline: str | None,
    criteria: Criteria = Criteria(),
    cells: Sequence[CellOutcome] = (),
    within: Sequence[PairedJob] = (),
) -> Judgement:
    """Promote, roll back or wait, from per-job outcomes of the canary and the baseline, the
    two compared within hardware classes (`paired`); where at least `min_jobs_rollback` canary
    jobs measured both versions' choices inside themselves (`within`), from those alone."""
    c, b = paired(
        _samples(outcomes, canary, criteria),
        _samples(outcomes, baseline, criteria) if baseline is not None else {},
    )
    nc, nb = c.n, b.n if b is not None else 0
    c_speed = math.exp(c.mean) if nc else None
    b_speed = math.exp(b.mean) if b is not None and nb else None

    def out(v: Verdict, reason: str) -> Judgement:
        return Judgement(v, nc, nb, c_speed, b_speed, reason)

    if baseline is not None and len(within) >= criteria.min_jobs_rollback:
        w = within_job.verdict(
            within, baseline, margin=criteria.margin, alpha=criteria.alpha,
            min_jobs_promote=criteria.min_jobs_promote,
            min_jobs_rollback=criteria.min_jobs_rollback,
        )  # fmt: skip
        return Judgement(Verdict(w.action), nc, nb, c_speed, b_speed, w.reason, len(within), w.gain)

    if nc < criteria.min_jobs_rollback:
        shared = " of the promoted version's hardware classes" if b is not None else ""
        return out(Verdict.WAIT, f"{nc} canary job(s){shared} with enough calls; waiting")
    bad = (
        slower_cells(cells, canary=canary, baseline=baseline, criteria=criteria) if baseline else []
    )
    if bad:
        return out(Verdict.ROLLBACK, f"canary {canary} is slower in {', '.join(bad[:4])}")
    if b is not None:
        b_mean, b_se2, b_dof = b.mean, b.se2, b.dof
        against = f"promoted version {baseline}"
    else:
        b_mean, b_se2, b_dof = 0.0, 0.0, -1  # NCCL's default: speedup 1 by definition
        against = "NCCL's default"
    diff = c.mean - b_mean
    # looks are counted by the canary's jobs (the promoted model's pile up faster and move
    # the comparison less)
    se = math.sqrt(c.se2 + b_se2)
    # Rolling back is the cheap mistake (a model version is dropped; the next run retrains),
    # promoting the expensive one (every new job gets it): rollback takes the normal quantile,
    # promotion Student's t, which widens the bound while the spread rests on a few jobs.
    z_back = criteria.fixed_z or simultaneous_z(nc, 1, criteria.alpha)
    z_promote = criteria.fixed_z or simultaneous_t(
        nc, welch_df(c.se2, c.dof + 1, b_se2, b_dof + 1), 1, criteria.alpha
    )
    thresh = math.log1p(criteria.margin)
    pct = (math.exp(diff) - 1) * 100
    if diff < -thresh and diff + z_back * se < 0:
        return out(Verdict.ROLLBACK, f"canary {canary} is {-pct:.1f}% slower than {against}")
    if nc < criteria.min_jobs_promote or (b is not None and nb < criteria.min_jobs_promote):
        return out(Verdict.WAIT, f"not enough jobs yet ({nc} canary, {nb} baseline)")
    if diff > thresh and diff - z_promote * se > 0:
        return out(Verdict.PROMOTE, f"canary {canary} is {pct:.1f}% faster than {against}")
    return out(Verdict.WAIT, f"canary {canary} vs {against}: {pct:+.1f}%, not conclusive")

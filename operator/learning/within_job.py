"""The canary judged inside its own jobs (issue 29): both versions' choices, one job.

A canary job explores the promoted version's choice wherever the two versions'
tables choose otherwise (its arms: policy/runtime/arms.py, stored by
operator/store/arms.py). So each such job measured, on its own nodes and calls,
what each version's choices cost there:

* per arm cell, log(promoted choice's mean time / canary choice's mean time), when
  the job ran each at least `MIN_ARM_CALLS` times (> 0: the canary's faster);
* per job, `log_gain`: log of the job's collective time had it run the promoted
  version's choices in those cells over its time with the canary's, every call of
  the job counted at its cell's measured mean (cells without a measured arm count the
  same on both sides). It is the whole-job comparison without the differences
  between jobs (their mix of sizes, their nodes, their noise) that a comparison with
  other jobs carries.

`verdict` judges those samples as `promotion.judge` judges whole jobs: one sample
per canary job, promote when the mean gain clears the margin with the sequential
bound (Student's t over the canary's job counts), roll back when it loses by the
margin with the normal bound, or when some cell's choice is slower beyond the margin
across its jobs. One job's made-up rewards cannot promote a canary: a sample far
from the others widens the spread as much as it moves the mean (with one outlying
job and the others equal, the t statistic is exactly 1, far below any bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.learning import ConfigKey
from dynamiccl.api.table import scale_class
from dynamiccl.operator.store.arms import ArmJob, ConfigTime
from dynamiccl.policy.online.sequential import simultaneous_t, simultaneous_z
from dynamiccl.policy.online.stats import mean_var

MIN_ARM_CALLS: Final = 16  # each arm's calls in a cell for a comparison (a finding's verdict's)
Cell = tuple[str, int, int, int]  # (collective, size bucket, nranks, nnodes)


@dataclass(frozen=True)
class PairedJob:
    """One canary job's comparison of the two versions' choices inside it."""

    job_uid: str
    log_gain: float  # > 0: the canary's choices made the job faster
    cells: dict[Cell, float]  # per measured arm cell: log(promoted's time / canary's)


def _mean_time(rows: Sequence[ConfigTime], config: ConfigKey) -> float | None:
    calls = sum(r.calls for r in rows if r.config == config)
    if calls < MIN_ARM_CALLS:
        return None
    return sum(r.time_us for r in rows if r.config == config) / calls


def paired_job(job: ArmJob) -> PairedJob | None:
    """The job's comparison (module docstring); None when no arm cell was measured."""
    arms = {(a.collective, a.size_bucket, a.scale): a for a in job.arms}
    by_cell: dict[Cell, list[ConfigTime]] = {}
    for r in job.times:
        by_cell.setdefault((r.collective, r.size_bucket, r.nranks, r.nnodes), []).append(r)
    canary_us = baseline_us = 0.0
    cells: dict[Cell, float] = {}
    for cell, rows in by_cell.items():
        calls = sum(r.calls for r in rows)
        arm = arms.get((cell[0], cell[1], scale_class(cell[2], cell[3])))
        mine = _mean_time(rows, arm.choice.key) if arm is not None else None
        theirs = _mean_time(rows, arm.baseline.key) if arm is not None else None
        if mine is not None and theirs is not None and mine > 0 and theirs > 0:
            canary_us += calls * mine
            baseline_us += calls * theirs
            cells[cell] = math.log(theirs / mine)
            continue
        own = sum(r.calls - r.explore_calls for r in rows)
        own_us = sum(r.time_us - r.explore_time_us for r in rows)
        t = own_us / own if own > 0 else sum(r.time_us for r in rows) / max(calls, 1)
        canary_us += calls * t
        baseline_us += calls * t
    if not cells or canary_us <= 0:
        return None
    return PairedJob(job.job_uid, math.log(baseline_us / canary_us), cells)


def paired_jobs(jobs: Sequence[ArmJob]) -> list[PairedJob]:
    """The canary jobs with a measured arm, each compared inside itself."""
    return [p for p in map(paired_job, jobs) if p is not None]


@dataclass(frozen=True)
class Verdict:
    """'promote', 'rollback' or 'wait', with the mean gain and why."""

    action: str
    gain: float  # geometric mean over the jobs: promoted's time / canary's (> 1: canary faster)
    reason: str


def slower_cells(
    jobs: Sequence[PairedJob], *, margin: float, alpha: float, min_jobs: int
) -> list[str]:
    """Cells whose canary choice was slower than the promoted version's inside at least
    `min_jobs` jobs, by more than the margin with the normal bound (error budget split over
    the cells)."""
    by_cell: dict[Cell, list[float]] = {}
    for j in jobs:
        for cell, g in j.cells.items():
            by_cell.setdefault(cell, []).append(g)
    both = sorted(k for k, v in by_cell.items() if len(v) >= min_jobs)
    out = []
    for k in both:
        mean, var = mean_var(by_cell[k])
        z = simultaneous_z(len(by_cell[k]), len(both), alpha)
        if mean < -math.log1p(margin) and mean + z * math.sqrt(var / len(by_cell[k])) < 0:
            out.append(f"{k[0]}/b{k[1]}/{k[2]}x{k[3]} {(math.exp(-mean) - 1) * 100:.1f}%")
    return out


def verdict(
    jobs: Sequence[PairedJob],
    baseline: str,
    *,
    margin: float,
    alpha: float,
    min_jobs_promote: int,
    min_jobs_rollback: int,
) -> Verdict:
    """The canary's verdict from its jobs' comparisons inside themselves (module docstring)."""
    n = len(jobs)
    gains = [j.log_gain for j in jobs]
    mean, var = mean_var(gains) if n else (0.0, 0.0)
    pct = (math.exp(mean) - 1) * 100
    where = f"inside {n} canary job(s), against {baseline}'s choices"
    bad = slower_cells(jobs, margin=margin, alpha=alpha, min_jobs=min_jobs_rollback)
    if bad:
        return Verdict("rollback", math.exp(mean), f"{where}: slower in {', '.join(bad[:4])}")
    thresh = math.log1p(margin)
    se = math.sqrt(var / n) if n else 0.0
    if n >= min_jobs_rollback and mean < -thresh and mean + simultaneous_z(n, 1, alpha) * se < 0:
        return Verdict("rollback", math.exp(mean), f"{where}: {-pct:.1f}% slower")
    t = simultaneous_t(n, n - 1, 1, alpha) if n >= 2 else math.inf
    if n >= min_jobs_promote and mean > thresh and mean - t * se > 0:
        return Verdict("promote", math.exp(mean), f"{where}: {pct:.1f}% faster")
    return Verdict("wait", math.exp(mean), f"{where}: {pct:+.1f}%, not conclusive")

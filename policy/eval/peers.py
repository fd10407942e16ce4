"""`bench tune --peers`: what a user would run instead of DynamICCL's online tuner.

Every strategy plays the same bucket (the surface's rows as arms) for the same
`budget` calls, each call's time drawn with `bench_tune.measure` from a
generator seeded like `tune_bucket`'s (same seeds, and the same normal deviates
in call order: common random numbers). Two figures per bucket:

- final regret: mean time of the configuration it ends on / best - 1;
- exploration cost: mean time over all `budget` calls (each call's
  configuration's mean time) / best - 1: every exploratory call is a real
  training step.

The peers (DynamICCL itself is `tune_bucket`, the bench's procedure):

- ``nccl``: NCCL's own pick on every call;
- ``static``: the policy's first choice on every call (its table, no tuning);
- ``coordinate descent``: AutoCCL's method (Xu et al., "AutoCCL: Automated
  Collective Communication Tuning for Accelerating Distributed and Parallel DNN
  Training", NSDI'25): start from NCCL's pick and descend one coordinate at a
  time (algorithm, protocol, channels) over the surface's configurations,
  measuring each candidate for `CD_CALLS` calls (AutoCCL measures a few
  iterations per candidate in the early steps of training), moving to the best
  value of the coordinate, until a full pass moves nothing; then it exploits
  the best configuration measured. Implemented from the paper's idea;
- ``ucb``: UCB1 on log-times over every configuration, no prior (each
  configuration once, then mean - sd * sqrt(2 ln t / n), pooled sd); final =
  the lowest mean among the arms played most;
- ``uniform``: the budget spread round-robin over every configuration in a
  seeded order; final = the lowest measured mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.eval.bench_tune import Arm, measure

CD_CALLS: Final = 3  # calls per coordinate-descent candidate


@dataclass(frozen=True)
class Case:
    """One bucket as every strategy sees it."""

    collective: Collective
    nbytes: int
    arms: Sequence[Arm]
    scores: Sequence[float]  # the prior's (higher = more promising)
    default: int | None  # NCCL's pick
    seed: int

    def rng(self) -> np.random.Generator:
        """The measurement generator (`tune_bucket` seeds its own the same way)."""
        return np.random.default_rng([self.seed, self.collective.nccl_id, self.nbytes])

    @property
    def start(self) -> int:
        """NCCL's pick, else the prior's first choice."""
        if self.default is not None:
            return self.default
        return max(range(len(self.arms)), key=lambda i: (self.scores[i], -i))


@dataclass
class Outcome:
    """Final arm and the mean time of every call played."""

    final: int
    played: list[float]


Strategy = Callable[[Case, int], Outcome]


class _Meter:
    """Measures calls from one generator and keeps per-arm log-time sums."""

    def __init__(self, case: Case, budget: int) -> None:
        self.case, self.budget, self.rng = case, budget, case.rng()
        n = len(case.arms)
        self.n, self.s, self.ss = [0] * n, [0.0] * n, [0.0] * n
        self.played: list[float] = []

    @property
    def left(self) -> int:
        return self.budget - len(self.played)

    def call(self, i: int) -> None:
        arm = self.case.arms[i]
        y = math.log(measure(arm, self.rng))
        self.played.append(arm.time_us)
        self.n[i] += 1
        self.s[i] += y
        self.ss[i] += y * y

    def mean(self, i: int) -> float:
        return self.s[i] / self.n[i] if self.n[i] else math.inf

    def finish(self, final: int) -> Outcome:
        while self.left > 0:
            self.call(final)
        return Outcome(final, self.played)


def fixed(pick: Callable[[Case], int]) -> Strategy:
    """Always the same configuration (NCCL's pick, the policy's first choice)."""

    def run(case: Case, budget: int) -> Outcome:
        return _Meter(case, budget).finish(pick(case))

    return run


def static_choice(case: Case) -> int:
    return max(range(len(case.arms)), key=lambda i: (case.scores[i], -i))


def _neighbours(arms: Sequence[Arm], cur: int, coord: int) -> list[int]:
    """Arms differing from `cur` in coordinate `coord` only (0 algo, 1 proto, 2 channels);
    for algo/proto the same channel count if that row exists, else NCCL's channel row,
    else the pair's first row."""
    c = arms[cur]
    if coord == 2:
        return [i for i, a in enumerate(arms) if (a.algo, a.proto) == (c.algo, c.proto)]
    out = []
    pairs = {(a.algo, a.proto) for a in arms}
    values = sorted({p[coord] for p in pairs}, key=lambda v: v.nccl_id)
    for v in values:
        pair = (v, c.proto) if coord == 0 else (c.algo, v)
        rows = [i for i, a in enumerate(arms) if (a.algo, a.proto) == pair]
        if not rows:
            continue
        same = [i for i in rows if arms[i].nchannels == c.nchannels]
        dflt = [i for i in rows if arms[i].nchannels is None]
        out.append((same or dflt or rows)[0])
    return out


def coordinate_descent(case: Case, budget: int) -> Outcome:
    """AutoCCL-style coordinate descent from NCCL's pick (module docstring)."""
    m = _Meter(case, budget)
    cur = case.start
    moved, coord, still = True, 0, 0
    while m.left > 0 and still < 3:
        for i in _neighbours(case.arms, cur, coord):
            while m.n[i] < CD_CALLS and m.left > 0:
                m.call(i)
        best = min((i for i in range(len(case.arms)) if m.n[i]), key=lambda i: (m.mean(i), i))
        moved = best != cur
        cur = best
        still = 0 if moved else still + 1
        coord = (coord + 1) % 3
    return m.finish(cur)


def _pooled_sd(m: _Meter) -> float:
    dev = sum(max(0.0, ss - s * s / n) for n, s, ss in zip(m.n, m.s, m.ss, strict=True) if n > 1)
    dof = sum(n - 1 for n in m.n if n > 1)
    return math.sqrt((4 * 0.05**2 + dev) / (4 + dof))


def ucb(case: Case, budget: int) -> Outcome:
    """UCB1 on log-times, no prior (module docstring)."""
    m = _Meter(case, budget)
    order = list(case.rng().permutation(len(case.arms)))
    for i in order:
        if m.left <= 0:
            break
        m.call(int(i))
    while m.left > 0:
        t, sd = len(m.played), _pooled_sd(m)
        idx = [m.mean(i) - sd * math.sqrt(2 * math.log(t) / m.n[i]) for i in range(len(m.n))]
        m.call(int(np.argmin(idx)))
    most = max(m.n)
    final = min((i for i in range(len(m.n)) if m.n[i] == most), key=lambda i: (m.mean(i), i))
    return Outcome(final, m.played)


def uniform(case: Case, budget: int) -> Outcome:
    """The budget round-robin over every configuration; final = the lowest mean."""
    m = _Meter(case, budget)
    order = [int(i) for i in case.rng().permutation(len(case.arms))]
    for j in range(budget):
        m.call(order[j % len(order)])
    measured = [i for i in range(len(m.n)) if m.n[i]]
    return Outcome(min(measured, key=lambda i: (m.mean(i), i)), m.played)


PEERS: Final[dict[str, Strategy]] = {
    "NCCL default": fixed(lambda c: c.start),
    "static policy": fixed(static_choice),
    "coordinate descent": coordinate_descent,
    "UCB (no prior)": ucb,
    "uniform": uniform,
}


def figures(case: Case, out: Outcome) -> tuple[float, float]:
    """(final regret, exploration cost) of one strategy's run on one bucket."""
    best = min(a.time_us for a in case.arms)
    return case.arms[out.final].time_us / best - 1.0, float(np.mean(out.played)) / best - 1.0

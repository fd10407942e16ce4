"""Gaussian Thompson sampling over log collective times.

Each arm is one candidate configuration of a bucket. Rewards are log(time):
collective times are positive and their noise is roughly multiplicative, so in
log space one noise scale fits every size from 8 B to 16 GiB.

Posterior per arm: mean log-time ~ N(m, s^2) from a normal prior and the arm's
samples with a pooled noise estimate (a scaled inverse-chi-square prior on the
noise keeps the estimate sane with few samples). The exploration weights of the
next epoch are each arm's posterior probability of being the fastest (Thompson
sampling's allocation), estimated by Monte-Carlo with a seeded generator, so the
same inputs always give the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class BanditConfig(BaseModel):
    """Knobs of the Thompson sampler (log-time units)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior_sd: float = Field(default=0.25, gt=0, description="prior sd of an arm's mean log-time")
    noise_sd: float = Field(default=0.05, gt=0, description="prior guess of per-call log noise")
    noise_dof: float = Field(default=4.0, gt=0, description="pseudo-samples behind noise_sd")
    draws: int = Field(default=1024, ge=16, le=1 << 16, description="Monte-Carlo draws")


@dataclass
class ArmStats:
    """Sufficient statistics of one arm's log-time samples."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, log_time: float) -> None:
        self.n += 1
        self.total += log_time
        self.total_sq += log_time * log_time

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    @property
    def sum_sq_dev(self) -> float:
        if self.n < 2:
            return 0.0
        return max(0.0, self.total_sq - self.total * self.total / self.n)


@dataclass(frozen=True)
class Posterior:
    """Posterior of one arm's mean log-time."""

    mean: float
    sd: float
    n: int


def pooled_noise_sd(arms: Sequence[ArmStats], cfg: BanditConfig) -> float:
    """Noise sd shared by all arms: prior pseudo-samples plus within-arm deviations."""
    ss = sum(a.sum_sq_dev for a in arms)
    dof = sum(max(0, a.n - 1) for a in arms)
    var = (cfg.noise_dof * cfg.noise_sd**2 + ss) / (cfg.noise_dof + dof)
    return math.sqrt(var)


def prior_centre(arms: Sequence[ArmStats], prior_means: Sequence[float | None]) -> list[float]:
    """Prior mean per arm: the given one, else the grand mean of all samples (0 if none)."""
    n = sum(a.n for a in arms)
    grand = sum(a.total for a in arms) / n if n else 0.0
    return [grand if m is None else m for m in prior_means]


def posteriors(
    arms: Sequence[ArmStats],
    cfg: BanditConfig,
    prior_means: Sequence[float | None] | None = None,
) -> list[Posterior]:
    """Normal-normal posterior of every arm's mean log-time."""
    means = prior_centre(arms, prior_means or [None] * len(arms))
    noise_var = pooled_noise_sd(arms, cfg) ** 2
    prior_prec = 1.0 / cfg.prior_sd**2
    out = []
    for arm, m0 in zip(arms, means, strict=True):
        prec = prior_prec + arm.n / noise_var
        mean = (m0 * prior_prec + arm.total / noise_var) / prec
        out.append(Posterior(mean=mean, sd=math.sqrt(1.0 / prec), n=arm.n))
    return out


def best_probabilities(
    post: Sequence[Posterior], seed: int, eligible: Sequence[bool] | None = None, draws: int = 1024
) -> list[float]:
    """P(arm is fastest) under the posteriors; ineligible arms get 0. Deterministic in `seed`."""
    k = len(post)
    ok = np.array(eligible if eligible is not None else [True] * k, dtype=bool)
    if not ok.any():
        raise ValueError("eligible: no arm is eligible")
    rng = np.random.default_rng(seed & ((1 << 63) - 1))
    mu = np.array([p.mean for p in post])
    sd = np.array([p.sd for p in post])
    samples = mu[None, :] + sd[None, :] * rng.standard_normal((draws, k))
    samples[:, ~ok] = np.inf
    winners = np.argmin(samples, axis=1)
    counts = np.bincount(winners, minlength=k).astype(float)
    return list(counts / draws)


def leader(post: Sequence[Posterior], eligible: Sequence[bool] | None = None) -> int:
    """The eligible arm with the lowest posterior mean (ties: lowest index)."""
    k = len(post)
    ok = list(eligible) if eligible is not None else [True] * k
    cands = [i for i in range(k) if ok[i]]
    if not cands:
        raise ValueError("eligible: no arm is eligible")
    return min(cands, key=lambda i: (post[i].mean, i))

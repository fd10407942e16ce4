"""Per-arm statistics of log collective times and the pooled noise estimate.

Each arm is one candidate configuration of a cell. Samples are log(time):
collective times are positive and their noise is roughly multiplicative, so in
log space one noise scale fits every size from 8 B to 16 GiB.

`ArmStats` keeps an arm's sufficient statistics; `pooled_noise_sd` is the per-call
noise shared by all arms: a scaled inverse-chi-square prior (`BanditConfig`) plus
the arms' within-arm deviations, which keeps the estimate sane with few samples.
The race (race.py), the commit rules (commit.py), the guardrail (guardrail.py), the
tuner (tuner.py) and the sidecar's static guard read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class BanditConfig(BaseModel):
    """The prior of the pooled noise estimate (log-time units)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    noise_sd: float = Field(default=0.05, gt=0, description="prior guess of per-call log noise")
    noise_dof: float = Field(default=4.0, gt=0, description="pseudo-samples behind noise_sd")


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


def pooled_noise_sd(arms: Sequence[ArmStats], cfg: BanditConfig) -> float:
    """Noise sd shared by all arms: prior pseudo-samples plus within-arm deviations."""
    ss = sum(a.sum_sq_dev for a in arms)
    dof = sum(max(0, a.n - 1) for a in arms)
    var = (cfg.noise_dof * cfg.noise_sd**2 + ss) / (cfg.noise_dof + dof)
    return math.sqrt(var)

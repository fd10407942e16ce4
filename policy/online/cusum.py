"""Two-sided CUSUM change detection on standardized log-time residuals.

Page's cumulative sum: with z = (y - reference) / sd for each new sample,
S+ = max(0, S+ + z - k) and S- = max(0, S- - z - k); an alarm fires when either
exceeds h. With k = 0.5 and h = 8 the in-control average run length is thousands of
samples while a one-sd shift is caught within ~17 samples (a 20 % slowdown
under 4 % noise within ~3), which is the
trade-off an online tuner wants: re-open exploration soon after the fabric or
the workload really changed, almost never because of noise.

The allowance is at least half of `min_shift` (the smallest change worth
re-exploring for, in log-time units; 0.1 ≈ 10 %): the reference mean of an arm
the tuner selected is biased low (it won because its samples were low), and an
allowance that small shifts cannot accumulate keeps that bias from reading as
a change.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class CusumConfig(BaseModel):
    """Allowance `k` and decision threshold `h`, in units of the noise sd."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: float = Field(default=0.5, ge=0)
    min_shift: float = Field(
        default=0.1, ge=0, description="smallest log-time shift worth re-exploring for"
    )
    h: float = Field(default=8.0, gt=0)
    warmup: int = Field(default=2, ge=0, description="samples after a reset before it arms")
    min_reference: int = Field(
        default=16, ge=1, description="samples behind the reference mean before it arms"
    )


@dataclass
class Cusum:
    """CUSUM state for one stream (one bucket's exploited arm)."""

    cfg: CusumConfig
    pos: float = 0.0
    neg: float = 0.0
    seen: int = 0

    def reset(self) -> None:
        self.pos = 0.0
        self.neg = 0.0
        self.seen = 0

    def update(self, value: float, reference: float, sd: float) -> bool:
        """Feed one sample; True when a shift (either direction) is detected.

        The detector resets itself after an alarm so the next regime starts clean.
        """
        if sd <= 0:
            raise ValueError(f"sd must be > 0, got {sd}")
        self.seen += 1
        if self.seen <= self.cfg.warmup:
            return False
        z = (value - reference) / sd
        k = max(self.cfg.k, self.cfg.min_shift / (2.0 * sd))
        self.pos = max(0.0, self.pos + z - k)
        self.neg = max(0.0, self.neg - z - k)
        if self.pos > self.cfg.h or self.neg > self.cfg.h:
            self.reset()
            return True
        return False

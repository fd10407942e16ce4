"""The regression guardrail: a bucket goes back to NCCL's default when the tuned
choice measures worse than the default by more than the policy's threshold.

The test is one-sided on log-times and needs evidence, not one unlucky sample:
the choice trips when mean(choice) - mean(default) exceeds log(1 + threshold) by
`z` standard errors (Welch-style, with the pooled noise sd as a floor).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.policy.online.bandit import ArmStats


class GuardrailConfig(BaseModel):
    """Regression threshold (fraction, from the NCCLTuningPolicy) and evidence needed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(default=0.02, ge=0, le=10, description="allowed slowdown vs default")
    z: float = Field(default=2.0, ge=0, description="standard errors of evidence required")
    min_samples: int = Field(default=4, ge=1, description="samples of each side before judging")


def regression(choice: ArmStats, default: ArmStats) -> float | None:
    """Measured slowdown of `choice` vs `default` (exp of the log-mean gap, minus 1).

    None when either side has no samples.
    """
    if choice.n == 0 or default.n == 0:
        return None
    return math.exp(choice.mean - default.mean) - 1.0


def trips(choice: ArmStats, default: ArmStats, noise_sd: float, cfg: GuardrailConfig) -> bool:
    """True when `choice` is worse than `default` by more than the threshold, with evidence."""
    if choice.n < cfg.min_samples or default.n < cfg.min_samples:
        return False
    gap = choice.mean - default.mean
    se = noise_sd * math.sqrt(1.0 / choice.n + 1.0 / default.n)
    return gap > math.log1p(cfg.threshold) + cfg.z * se


def beats(choice: ArmStats, default: ArmStats, noise_sd: float, cfg: GuardrailConfig) -> bool:
    """True when `choice` is faster than `default` with `z` standard errors of evidence."""
    if choice.n < cfg.min_samples or default.n < cfg.min_samples:
        return False
    gap = default.mean - choice.mean
    se = noise_sd * math.sqrt(1.0 / choice.n + 1.0 / default.n)
    return gap > cfg.z * se


def trips_estimate(
    choice: ArmStats, default_log_time: float, noise_sd: float, cfg: GuardrailConfig
) -> bool:
    """`trips` against an estimate of the default's log-time instead of its samples."""
    if choice.n < cfg.min_samples:
        return False
    se = noise_sd / math.sqrt(choice.n)
    return choice.mean - default_log_time > math.log1p(cfg.threshold) + cfg.z * se

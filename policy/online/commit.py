"""Which measured arm a cell's tuner commits (tuner.py, with the race, race.py): the final
choice when exploration ends, the same rule mid-race (`final_choice`: no lucky look), and
the escape from a committed arm that a look measured far slower (`escape`); `is_out`
tells whether an arm is clearly slower than the leader. Pure arithmetic on the agreed
statistics, as the race is."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dynamiccl.policy.online.bandit import ArmStats
from dynamiccl.policy.online.race import RaceConfig


def final_choice(
    stats: Sequence[ArmStats], eligible: Sequence[bool], noise_sd: float, cfg: RaceConfig
) -> int | None:
    """The arm to keep once exploration ends: among the arms with `final_calls` calls
    (all measured ones if none has), the lowest mean log-time even `final_z` standard
    errors against it (a lucky arm with few calls loses to a well-measured one just as
    fast); None if nothing eligible was measured."""
    measured = [i for i, s in enumerate(stats) if eligible[i] and s.n]
    if not measured:
        return None
    enough = [i for i in measured if stats[i].n >= cfg.final_calls] or measured
    return min(
        enough, key=lambda i: (stats[i].mean + cfg.final_z * noise_sd / math.sqrt(stats[i].n), i)
    )


def escape(
    stats: Sequence[ArmStats],
    eligible: Sequence[bool],
    noise_sd: float,
    cfg: RaceConfig,
    lead: int | None,
) -> int | None:
    """`lead` (the final choice's rule's leader), unless a measured arm with fewer calls
    beats it by `escape_z` standard errors: then the fastest such arm. A look that is
    that much faster is no luck, and every call the lead keeps costs the gap."""
    if lead is None:
        return None
    top, n = stats[lead].mean, stats[lead].n
    ahead = [
        i
        for i, s in enumerate(stats)
        if s.n
        and s.mean < top
        and eligible[i]
        and top - s.mean > cfg.escape_z * noise_sd * math.sqrt(1.0 / s.n + 1.0 / n)
    ]
    return min(ahead, key=lambda i: (stats[i].mean, i)) if ahead else lead


def is_out(
    stats: Sequence[ArmStats], eligible: Sequence[bool], noise_sd: float, cfg: RaceConfig, i: int
) -> bool:
    """`i in race(...).out` without planning the looks: arm i is measured and its mean is
    above the leader's by more than `z` standard errors."""
    if not stats[i].n or not eligible[i]:
        return False
    measured = [j for j, s in enumerate(stats) if eligible[j] and s.n > 0]
    lead = min(measured, key=lambda j: (stats[j].mean, j))
    se = noise_sd * math.sqrt(1.0 / stats[i].n + 1.0 / stats[lead].n)
    return lead != i and stats[i].mean - stats[lead].mean > cfg.z * se

"""The two phases of a cell's exploration with Thompson sampling (`TunerConfig.race` None):
the table's arms, then the first phase's leader's channel variants. With the race
(the default) one phase walks the channel ladders instead (race.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def phase_budgets(budget: int, refine: float, epoch_calls: int) -> tuple[int, int]:
    """Exploration budgets (first phase, second phase) of a cell tuned in two phases:
    the second gets the `refine` share, the first the rest rounded to whole epochs
    (at least one), so it ends at an epoch boundary, where plans change."""
    second = int(budget * refine)
    if not second:
        return budget, 0
    epochs = max(1, round((budget - second) / epoch_calls))
    return epochs * epoch_calls, second


def second_phase_arms(lead: T, variants: Iterable[T], default: T | None) -> list[T] | None:
    """The second phase's arms: the first phase's leader, its variants and NCCL's pick
    (kept, so the result can only move to something measured better); None when there
    is no variant to try. Their prior (`second_phase_prior`) puts the leader first."""
    arms = [lead, *(v for v in variants if v != lead)]
    if default is not None and default not in arms:
        arms.append(default)
    return arms if len(arms) > 1 + (default is not None and default != lead) else None


def second_phase_prior(n_arms: int) -> list[float]:
    """Prior weights of `second_phase_arms`: the leader 4, every other arm 1."""
    return [4.0] + [1.0] * (n_arms - 1)

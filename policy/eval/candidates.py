"""The arms `dynamiccl bench tune` gives a bucket's tuner: the prior's top configurations,
one per (algo, proto) first, plus NCCL's pick; with the race, their channel variants."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

PAIR_SHARE = 1.0  # share of the candidate slots kept for one arm per (algo, proto)


def candidate_set(
    scores: Sequence[float],
    default: int | None,
    max_candidates: int,
    groups: Sequence[Hashable] | None = None,
) -> tuple[list[int], list[float]]:
    """The prior's top arms plus the default, and their prior weights.

    With `groups` (e.g. each arm's (algo, proto)), the first half of the slots
    goes to the best-scored arm of each of the most promising groups, so the
    candidates are diverse rather than many variants of one configuration;
    the rest are filled in score order. Weights are the softmax of the scores
    over the chosen arms (the default keeps its own score), so the tuner's
    first epoch follows the policy's confidence.
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen: list[int] = []
    if groups is not None:
        seen: set[Hashable] = set()
        for i in order:
            if len(chosen) >= max(1, int(max_candidates * PAIR_SHARE)):
                break
            if groups[i] not in seen:
                seen.add(groups[i])
                chosen.append(i)
    for i in order:
        if len(chosen) >= max_candidates:
            break
        if i not in chosen:
            chosen.append(i)
    if default is not None and default not in chosen:
        chosen.append(default)
    top = max(scores[i] for i in chosen)
    weights = [math.exp(max(-50.0, scores[i] - top)) for i in chosen]
    return chosen, weights


def with_channel_variants(
    groups: Sequence[Hashable], idx: list[int], weights: list[float]
) -> tuple[list[int], list[float]]:
    """`idx` plus every other arm of the chosen arms' groups (their (algo, proto)),
    weighted below every chosen arm (the race reaches them over the channel ladder)."""
    mine = {groups[i] for i in idx}
    low = min(weights) * 1e-3
    extra = [i for i, g in enumerate(groups) if g in mine and i not in idx]
    return idx + extra, weights + [low] * len(extra)

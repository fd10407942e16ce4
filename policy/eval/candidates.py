"""The arms `dynamiccl bench tune` gives a bucket's tuner: the prior's best configuration
of every (algo, proto), its other top ones, plus NCCL's pick; with the race, their channel
variants."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def candidate_set(
    scores: Sequence[float],
    default: int | None,
    max_candidates: int,
    groups: Sequence[Hashable] | None = None,
) -> tuple[list[int], list[float]]:
    """The prior's top arms plus the default, and their prior weights.

    With `groups` (e.g. each arm's (algo, proto)), the best-scored arm of every
    group comes first (in score order), so the candidates are diverse rather
    than many variants of one configuration, and a group the prior ranks low is
    still a candidate (a group left out is never tried); up to `max_candidates`
    are then filled in score order. Weights are the softmax of the scores
    over the chosen arms (the default keeps its own score), so the tuner's
    first epoch follows the policy's confidence.
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen: list[int] = []
    if groups is not None:
        seen: set[Hashable] = set()
        for i in order:  # every group, even beyond max_candidates: a pair left out is
            if groups[i] not in seen:  # never tried, and the prior may rank the best one low
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


def with_pair_probes(
    groups: Sequence[Hashable],
    probes: Sequence[int],
    idx: list[int],
    weights: list[float],
) -> tuple[list[int], list[float]]:
    """`idx` plus, for every group none of its arms is in, its arm among `probes` (the
    sidecar: NCCL's channel count of every (algo, proto) the table leaves out,
    sidecar/tuning.py), weighted below every chosen arm in `probes` order: the race gives
    each one look (`RaceConfig.probe_pairs`)."""
    mine = {groups[i] for i in idx}
    low = min(weights) * 1e-2
    extra: list[int] = []
    for i in probes:
        if groups[i] not in mine:
            mine.add(groups[i])
            extra.append(i)
    return idx + extra, weights + [low * 0.5**k for k in range(len(extra))]


def with_channel_variants(
    groups: Sequence[Hashable], idx: list[int], weights: list[float]
) -> tuple[list[int], list[float]]:
    """`idx` plus every other arm of the chosen arms' groups (their (algo, proto)),
    weighted below every chosen arm (the race reaches them over the channel ladder)."""
    mine = {groups[i] for i in idx}
    low = min(weights) * 1e-3
    extra = [i for i, g in enumerate(groups) if g in mine and i not in idx]
    return idx + extra, weights + [low] * len(extra)

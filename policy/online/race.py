"""A noise-aware race between a cell's arms: the exploration plan `BucketTuner` uses
when `TunerConfig.race` is set (the default: `dynamiccl bench tune` and the sidecar).

Thompson sampling (bandit.py) spreads calls in proportion to each arm's chance of
being fastest; with a wide prior that is every arm for several epochs, and every
exploratory call is a real training step. The race spends calls only where they
can still change the answer, in the order the policy's prior ranks the arms
(arm index order: the callers list them best first):

- the leader is the measured eligible arm with the lowest mean log-time;
- an arm is *out* while its mean is above the leader's by more than `z`
  standard errors (pooled noise): clearly slower, no more calls. Not sticky:
  if the leader's mean drifts up, the arm comes back;
- an arm is *settled* when, even `z` standard errors in its favour, it cannot
  beat the leader by `indifference`: the winner is clear enough;
- every other arm is *open* and gets `open_calls` expected calls per epoch;
  arms never measured get `new_calls` (one look: a bad arm costs one call),
  in prior order, while candidate slots are free.

The plan: the leader (once the committed arm is out, or by the tuner's
switching rule) is committed and takes every call the candidates do not;
the candidates' expected calls set the explore probability. Exploration ends
when no arm is open or new (`explore == 0`), or when the tuner's budget is
spent. Pure arithmetic on the tuner's statistics: every rank derives the same
plan from the same agreed measurements (DESIGN.md §3.2).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.table import MAX_CANDIDATES, WEIGHT_MAX
from dynamiccl.policy.online.bandit import ArmStats

LOOK_CALLS = 16  # `new_calls` / `open_calls` are per this many calls of a longer epoch


class RaceConfig(BaseModel):
    """How clear a winner must be, and how many calls a look takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    z: float = Field(default=1.5, gt=0, description="standard errors that make an arm out")
    indifference: float = Field(
        default=0.005, ge=0, description="log-time gain not worth more calls to resolve"
    )
    new_calls: float = Field(default=1.0, gt=0, description="expected calls of a first look")
    open_calls: float = Field(default=3.0, gt=0, description="expected calls per epoch when open")
    ladder_reach: float = Field(
        default=0.1,
        ge=0,
        description="log-time gap to the leader within which a rung's neighbours are looked at",
    )
    tail: bool = Field(
        default=True,
        description="once the prior's candidates are decided, look at what it ruled out",
    )
    tail_misses: int = Field(
        default=2,
        ge=1,
        description=(
            "without the prior's gate, groups are looked at in the prior's order until this "
            "many in a row measured far out"
        ),
    )
    prior_top: int = Field(
        default=3, ge=1, description="arms the prior ranks highest that are always looked at"
    )
    prior_gate: float = Field(
        default=6.0,
        ge=0,
        description=(
            "log prior weight below the top under which an arm is never looked at, until the "
            "prior's first choice measures clearly slower than another arm"
        ),
    )


@dataclass(frozen=True)
class Race:
    """One epoch's verdicts: the leader and the arms that still need calls (with weights)."""

    leader: int | None  # None: nothing measured yet
    out: tuple[int, ...]
    wants: tuple[tuple[int, float], ...]  # (arm, expected calls this epoch), priority order
    opened: frozenset[int] = frozenset()  # the measured arms among `wants` (and the leader)


Rung = tuple[Hashable, int | None]  # (group, e.g. (algo, proto); rank of the channel count)


def channel_ladder(groups: Sequence[Hashable], channels: Sequence[int | None]) -> list[Rung]:
    """Each arm's group and rung on the channel-count ladder (rank among the distinct
    counts); rung None for NCCL's default count (None or 0), which is off the ladder."""
    counts: dict[Hashable, list[int]] = {}
    for g, c in zip(groups, channels, strict=True):
        if c and c not in counts.setdefault(g, []):
            counts[g].append(c)
    for v in counts.values():
        v.sort()
    return [(g, counts[g].index(c) if c else None) for g, c in zip(groups, channels, strict=True)]


def _ladder_looks(
    ladder: Sequence[Rung], measured: set[int], near: Sequence[int], admitted: set[Hashable]
) -> list[bool]:
    """Which unmeasured arms may be looked at. On its group's ladder: next to a measured
    rung of the group within reach of the leader (the time is unimodal in the channel
    count, AutoCCL NSDI'25; small departures do not stop the walk), else at the group's
    middle and top rungs once its NCCL-count arm (if any) is measured within reach.
    Off the ladder (NCCL's count): unless every measured arm of its group is far out.
    Only groups the prior admits."""
    members: dict[Hashable, list[int]] = {}
    for j, (g, _) in enumerate(ladder):
        members.setdefault(g, []).append(j)
    live: dict[Hashable, list[int]] = {}
    for j in near:
        live.setdefault(ladder[j][0], []).append(j)
    looks: dict[Hashable, set[int | None]] = {}
    for g, mine in members.items():
        here = live.get(g, [])
        if g not in admitted or (not here and any(j in measured for j in mine)):
            looks[g] = set()  # not admitted, or measured and far out
            continue
        steps = {r for j in here if (r := ladder[j][1]) is not None}
        rungs = [r for j in mine if (r := ladder[j][1]) is not None]
        if steps:
            ok: set[int | None] = {r + d for r in steps for d in (-1, 1)}
        elif rungs and not any(ladder[j][1] is None and j not in measured for j in mine):
            mid = (min(rungs) + max(rungs)) / 2
            ok = {r for r in rungs if abs(r - mid) < 1 or r == max(rungs)}
        else:
            ok = set()
        looks[g] = ok | {None}
    return [r in looks[g] for g, r in ladder]


def _prefix(
    order: Sequence[Hashable],
    ladder: Sequence[Rung],
    measured: set[int],
    near: set[Hashable],
    cfg: RaceConfig,
) -> set[Hashable]:
    """The groups in prior order (after the first `prior_top`) up to the first one not
    measured yet, or to `tail_misses` in a row measured and far out."""
    seen = {g for j, (g, _) in enumerate(ladder) if j in measured}
    out: set[Hashable] = set()
    misses = 0
    for n, g in enumerate(order):
        out.add(g)
        if n < cfg.prior_top:
            continue  # the prior's own picks do not count
        if g not in seen:
            break  # one new group at a time, so that misses can stop the tail
        misses = misses + 1 if g not in near else 0
        if misses >= cfg.tail_misses:
            break
    return out


def race(
    stats: Sequence[ArmStats],
    eligible: Sequence[bool],
    noise_sd: float,
    cfg: RaceConfig,
    *,
    admissible: Sequence[bool] | None = None,
    ladder: Sequence[Rung] | None = None,
    order: Sequence[Hashable] | None = None,
) -> Race:
    """The race's verdicts on the current statistics (see the module docstring).

    `admissible` (the prior's gate) leaves unmeasured arms out of the looks;
    `ladder` (`channel_ladder`) walks channel variants one rung at a time; without
    the gate, `order` (the groups, best first by the prior) admits groups up to
    `tail_misses` in a row that were measured far out."""
    k = len(stats)
    ok = admissible if admissible is not None else [True] * k
    measured = [i for i, s in enumerate(stats) if eligible[i] and s.n > 0]
    lead = min(measured, key=lambda i: (stats[i].mean, i)) if measured else None
    out: list[int] = []
    open_: list[tuple[int, int]] = []
    for i in measured:
        if i == lead or lead is None:
            continue
        s = stats[i]
        gap = s.mean - stats[lead].mean
        se = noise_sd * math.sqrt(1.0 / s.n + 1.0 / stats[lead].n)
        if gap > cfg.z * se:
            out.append(i)
            continue
        if cfg.z * se - gap >= cfg.indifference:
            open_.append((s.n, i))
    if ladder is not None:  # the prior admits groups; ladders walk their channel counts
        top = stats[lead].mean if lead is not None else 0.0
        reach = [j for j in measured if stats[j].mean - top <= cfg.ladder_reach]
        if admissible is None and order is not None:
            admitted = _prefix(order, ladder, set(measured), {ladder[j][0] for j in reach}, cfg)
        else:
            admitted = {ladder[i][0] for i in range(k) if ok[i]}
        walk = _ladder_looks(ladder, set(measured), reach, admitted)
        # the prior's own picks too (all of them only once it lost trust: then the walk)
        ok = walk if admissible is None else [a or w for a, w in zip(ok, walk, strict=True)]
    new = [(i, cfg.new_calls) for i in range(k) if eligible[i] and stats[i].n == 0 and ok[i]]
    opened = tuple((i, cfg.open_calls) for _, i in sorted(open_))
    return Race(lead, tuple(out), opened + tuple(new), frozenset(i for _, i in open_))


def race_candidates(
    r: Race, committed: int, epoch_calls: int, explore_budget: float
) -> tuple[tuple[tuple[int, int], ...], float]:
    """The plan's weighted candidates and explore probability for the race's wants."""
    wants = [(i, w) for i, w in r.wants if i != committed]
    if r.leader is not None and r.leader != committed:
        # a leader the tuner has not committed to yet needs calls to get there
        wants.insert(0, (r.leader, max((w for _, w in r.wants), default=1.0)))
    wants = wants[:MAX_CANDIDATES]
    if not wants:
        return (), 0.0
    # a longer epoch gives open arms proportionally more calls, a first look at most 2x
    scale = max(1.0, epoch_calls / LOOK_CALLS)
    full = r.opened | {r.leader}
    wants = [(i, w * (scale if i in full else min(scale, 2.0))) for i, w in wants]
    total = sum(w for _, w in wants)
    explore = min(total / epoch_calls, explore_budget, 1.0)
    top = max(w for _, w in wants)
    return tuple((i, max(1, round(w / top * WEIGHT_MAX))) for i, w in wants), explore

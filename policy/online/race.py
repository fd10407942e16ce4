"""A noise-aware race between a cell's arms: the exploration plan of `BucketTuner`
(`TunerConfig.race`; `dynamiccl bench tune` and the sidecar).

Spreading calls in proportion to each arm's chance of being fastest would, with a
wide prior, pay for every arm for several epochs, and every exploratory call is a
real training step. The race spends calls only where they
can still change the answer, in the order the policy's prior ranks the arms
(arm index order: the callers list them best first):

- the leader is the measured eligible arm with the lowest mean log-time;
- an arm is *out* while its mean is above the leader's by more than `z`
  standard errors (pooled noise): clearly slower, no more calls. Not sticky:
  if the leader's mean drifts up, the arm comes back;
- an arm is *settled* when, even `z` standard errors in its favour, it cannot
  beat the leader by `indifference`: the winner is clear enough;
- every other arm is *open*: it is near the leader, so its calls cost little,
  and it shares the epoch equally with the committed arm (at least
  `open_calls`); open arms that may still gain the most come first;
- arms never measured get `new_calls` (one look: a bad arm costs one call),
  in prior order, except rungs next to a rung measured within reach of the
  leader (`ladder_reach`): those are expected near it and get an open arm's
  share. A group with nothing measured comes first while only the committed
  arm's group is: every arm of that group may be equally slow and none is out,
  so its ladder is walked after one look elsewhere; a look that measures far
  ahead of the committed arm ends the epoch at once (`BucketTuner.escape_due`,
  docs/benchmarks.md, "NCCL's default badly wrong").
  Open arms and first looks take the candidate slots in turns, so neither
  starves the other.

Which arms may be looked at: the prior's gate (its top arms) and the channel
ladders walked from the middle and top rungs and next to every rung within
reach. When the prior's first choice measures clearly slower, or once the
prior's pairs are decided (only the leader's own channel counts still race),
the gate opens: groups are admitted in the prior's order until `tail_misses`
in a row measure far out, and so are the coordinate-descent neighbours (one of
algorithm and protocol changed) of the two best measured groups, so that a
prior which ranks the best group low does not hide it (AutoCCL's neighbourhood,
NSDI'25). A group whose measured arms are all far out is dropped, except NCCL's
pick's while only its NCCL count is measured: NCCL may misjudge just the count.

With `probe_pairs` (the sidecar's setting, tuner_config.sidecar_setting) every group's
best-ranked arm is admitted past the gate from the start (one look each), and once the
gate opens every group is admitted (far-out ones are dropped by the walk): a table of the
policy's most probable configurations, often channel variants of one or two pairs, then
still reaches a pair the prior ranks low, at the cost of one call per pair.

The plan: the leader (once the committed arm is out, or by the tuner's
switching rule) is committed and takes every call the candidates do not, as
soon as it has `final_calls` calls (`final_choice`'s rule: a sidecar's commit
runs a whole table round, thousands of calls on a busy cell, so a look that
won by luck is not committed; until then the leader gets calls, unless a look
beats it by `escape_z` standard errors: commit.escape);
the candidates' expected calls set the explore probability. Exploration ends
when no arm is open or new (`explore == 0`), or when the tuner's budget is
spent; in the budget's last epoch there are no first looks when epochs are short
(one call could not be followed up), while a long one (32 calls or more, a large
share of the budget) gives them an open arm's share; when the budget is spent the
tuner commits, among the arms with `final_calls` calls, the one whose time is
lowest even `final_z` standard errors against it (`final_choice`). Pure
arithmetic on the tuner's statistics: every rank derives the same plan from the
same agreed measurements (docs/plugin.md, 'The agreement protocol').
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.policy.online.bandit import ArmStats

LOOK_CALLS = 16  # `new_calls` / `open_calls` are per this many calls of a longer epoch


class RaceConfig(BaseModel):
    """How clear a winner must be, and how many calls a look takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    z: float = Field(default=1.5, gt=0, description="standard errors that make an arm out")
    final_z: float = Field(
        default=1.0,
        ge=0,
        description="standard errors against an arm when exploration ends and the best is chosen",
    )
    final_calls: int = Field(
        default=3,
        ge=1,
        description="calls an arm needs to be the final choice (unless no arm has them)",
    )
    indifference: float = Field(
        default=0.005, ge=0, description="log-time gain not worth more calls to resolve"
    )
    escape_z: float = Field(
        default=3.0,
        gt=0,
        description=(
            "standard errors by which an arm with fewer than final_calls calls must beat "
            "the final choice's rule's leader to be committed mid-race (`escape`)"
        ),
    )
    new_calls: float = Field(default=1.0, gt=0, description="expected calls of a first look")
    open_calls: float = Field(
        default=3.0,
        gt=0,
        description="least expected calls per epoch when open (else an equal share of the epoch)",
    )
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
        default=3,
        ge=1,
        description=(
            "without the prior's gate, groups are looked at in the prior's order until this "
            "many in a row measured far out"
        ),
    )
    probe_pairs: bool = Field(
        default=False,
        description=(
            "every group (algo, proto) gets one first look at its best-ranked arm, past the "
            "prior's gate; once the gate opens, every group not measured far out is admitted"
        ),
    )
    probe_reach: float = Field(
        default=2.0,
        ge=0,
        description=(
            "with probe_pairs, a pair is probed only while NCCL's estimate for it is within "
            "(1 + probe_reach) x the best pair's (probes.py)"
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
    steps: frozenset[int] = frozenset()  # unmeasured rungs next to one within reach


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


def pair_probes(ladder: Sequence[Rung], prior: Sequence[float]) -> set[int]:
    """The best-ranked arm of every group (`RaceConfig.probe_pairs`): one look each shows
    whether a group the prior ranks low is near the leader (then its ladder is walked)."""
    firsts: dict[Hashable, int] = {}
    for i in sorted(range(len(prior)), key=lambda i: (-prior[i], i)):
        firsts.setdefault(ladder[i][0], i)
    return set(firsts.values())


def _ladder_looks(
    ladder: Sequence[Rung],
    measured: set[int],
    near: Sequence[int],
    admitted: set[Hashable],
    keep: Hashable = None,
) -> tuple[list[bool], list[bool]]:
    """Which unmeasured arms may be looked at, and which of those are next to a rung
    measured within reach of the leader. On its group's ladder: next to such a rung
    (the time is unimodal in the channel count, AutoCCL NSDI'25; small departures do
    not stop the walk), and the group's middle and top rungs once its NCCL-count arm
    (if any) is measured within reach. Off the ladder (NCCL's count): unless every
    measured arm of its group is far out. Only groups the prior admits. The group `keep`
    (NCCL's pick's) is not dropped while only its NCCL-count arm is measured far out: its
    middle and top rungs get a look (NCCL may have misjudged only the channel count)."""
    members: dict[Hashable, list[int]] = {}
    for j, (g, _) in enumerate(ladder):
        members.setdefault(g, []).append(j)
    live: dict[Hashable, list[int]] = {}
    for j in near:
        live.setdefault(ladder[j][0], []).append(j)
    looks: dict[Hashable, set[int | None]] = {}
    steps: dict[Hashable, set[int | None]] = {}
    for g, mine in members.items():
        here = live.get(g, [])
        seen = [j for j in mine if j in measured]
        if g == keep and not any(ladder[j][1] is not None for j in seen):
            seen = []  # only NCCL's count measured: its ladder may still be near
        if g not in admitted or (not here and seen):
            looks[g] = steps[g] = set()  # not admitted, or measured and far out
            continue
        on = {r for j in here if (r := ladder[j][1]) is not None}
        rungs = [r for j in mine if (r := ladder[j][1]) is not None]
        steps[g] = {r + d for r in on for d in (-1, 1)}
        ok: set[int | None] = set(steps[g])
        if rungs and not any(ladder[j][1] is None and j not in measured for j in mine):
            mid = (min(rungs) + max(rungs)) / 2
            ok |= {r for r in rungs if abs(r - mid) < 1 or r == max(rungs)}
        looks[g] = ok | {None}
    return [r in looks[g] for g, r in ladder], [r in steps[g] for g, r in ladder]


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


def _neighbours(
    ladder: Sequence[Rung], stats: Sequence[ArmStats], measured: Sequence[int]
) -> set[Hashable]:
    """Coordinate-descent neighbours (one coordinate of the group changed, e.g. the
    algorithm or the protocol) of the two best measured groups: a prior that ranks the
    best group low must not hide it when the next best measured group points at it."""
    best: dict[Hashable, float] = {}
    for j in measured:
        g = ladder[j][0]
        best[g] = min(best.get(g, math.inf), stats[j].mean)
    top = sorted(best, key=lambda g: best[g])[:2]
    groups = {g for g, _ in ladder}
    return {
        g
        for g in groups
        for h in top
        if isinstance(g, tuple)
        and isinstance(h, tuple)
        and len(g) == len(h)
        and sum(a != b for a, b in zip(g, h, strict=True)) == 1
    }


def race(
    stats: Sequence[ArmStats],
    eligible: Sequence[bool],
    noise_sd: float,
    cfg: RaceConfig,
    *,
    admissible: Sequence[bool] | None = None,
    ladder: Sequence[Rung] | None = None,
    order: Sequence[Hashable] | None = None,
    default: int | None = None,
    committed: int | None = None,
) -> Race:
    """The race's verdicts on the current statistics (see the module docstring).

    `admissible` (the prior's gate) leaves unmeasured arms out of the looks;
    `ladder` (`channel_ladder`) walks channel variants one rung at a time; without
    the gate, `order` (the groups, best first by the prior) admits groups up to
    `tail_misses` in a row that were measured far out; `default` (NCCL's pick) keeps
    its group's ladder in reach while only NCCL's count of it is measured; the first
    looks go to groups neither measured nor `committed`'s first."""
    k = len(stats)
    ok = admissible if admissible is not None else [True] * k
    measured = [i for i, s in enumerate(stats) if eligible[i] and s.n > 0]
    lead = min(measured, key=lambda i: (stats[i].mean, i)) if measured else None
    out: list[int] = []
    open_: list[tuple[float, int]] = []
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
            open_.append((gap - cfg.z * se, i))  # the most it may still gain, best first
    if ladder is not None:  # the prior admits groups; ladders walk their channel counts
        top = stats[lead].mean if lead is not None else 0.0
        reach = [j for j in measured if stats[j].mean - top <= cfg.ladder_reach]
        if admissible is None and cfg.probe_pairs:  # far-out groups: dropped by the walk
            admitted = {g for g, _ in ladder}
        elif admissible is None and order is not None:
            admitted = _prefix(order, ladder, set(measured), {ladder[j][0] for j in reach}, cfg)
            admitted |= _neighbours(ladder, stats, measured)
        else:
            admitted = {ladder[i][0] for i in range(k) if ok[i]}
        keep = ladder[default][0] if default is not None else None
        walk, step = _ladder_looks(ladder, set(measured), reach, admitted, keep)
        # the prior's own picks too (all of them only once it lost trust: then the walk)
        ok = walk if admissible is None else [a or w for a, w in zip(ok, walk, strict=True)]
    else:
        step = [False] * k
    fresh = [i for i in range(k) if eligible[i] and stats[i].n == 0 and ok[i]]
    # while one group alone is measured, a group not measured yet first (one look shows
    # whether that group is far from the best), then rungs next to one within reach
    firsts = _group_firsts(
        fresh, ladder, [*measured, *([committed] if committed is not None else [])]
    )
    new = [(i, cfg.new_calls) for i in sorted(fresh, key=lambda i: (i not in firsts, not step[i]))]
    opened = [(i, cfg.open_calls) for _, i in sorted(open_)]
    return Race(
        lead,
        tuple(out),
        _interleave(opened, new),
        frozenset(i for _, i in open_),
        frozenset(i for i in fresh if step[i]),
    )


def _group_firsts(
    fresh: Sequence[int], ladder: Sequence[Rung] | None, tried: Sequence[int]
) -> set[int]:
    """The first of `fresh` (prior order) in a group none of `tried` is in, while `tried`
    are all in one group (none otherwise: the others tell how far that one is)."""
    seen = {ladder[i][0] for i in tried} if ladder is not None else set()
    if ladder is None or len(seen) > 1:
        return set()
    return set(next(([i] for i in fresh if ladder[i][0] not in seen), []))


def _interleave(
    a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]]
) -> tuple[tuple[int, float], ...]:
    """a[0], b[0], a[1], b[1], ...: open arms and first looks share the candidate slots."""
    out: list[tuple[int, float]] = []
    for n in range(max(len(a), len(b))):
        out.extend(x[n] for x in (a, b) if n < len(x))
    return tuple(out)


def decided(r: Race, committed: int, ladder: Sequence[Rung] | None) -> bool:
    """True once the race only wants the committed arm or, with channel ladders, only
    channel counts of the leader's group: the prior's groups are decided."""
    wants = [i for i, _ in r.wants if i != committed]
    if ladder is None or r.leader is None:
        return not wants
    mine = ladder[r.leader][0]
    return all(ladder[i][0] == mine for i in wants)

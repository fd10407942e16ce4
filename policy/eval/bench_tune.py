"""`dynamiccl bench tune`: online tuning against a response surface.

For every (collective, nbytes) of the surface: the policy's prior ranks the
surface's configurations, the online tuner (`online.BucketTuner`) explores the
top candidates plus NCCL's own pick for `budget` calls, each call's time drawn
from the row's (time_us, stddev_us) with a seeded generator, and the bucket's
final committed configuration is compared with the surface's best row:
regret = mean time of chosen / best - 1 (docs/policy.md, '`dynamiccl bench tune`').

The ranking is injected (`Prior`): the CLI passes the learned policy's
scores; tests can pass others (e.g. a deliberately wrong prior).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import size_bucket
from dynamiccl.policy.eval.candidates import (
    candidate_set,
    with_channel_variants,
    with_pair_probes,
)
from dynamiccl.policy.online.plan import plan_choice, round_plan
from dynamiccl.policy.online.probes import probe_order
from dynamiccl.policy.online.tuner import (
    BucketTuner,
    CellKey,
    TunerConfig,
    cell_tuner,
)
from dynamiccl.policy.sim.surface import Surface


@dataclass(frozen=True)
class Arm:
    """One configuration of a bucket with its true mean time and noise."""

    algo: Algo
    proto: Proto
    nchannels: int | None  # None = NCCL's default channel count
    time_us: float
    stddev_us: float
    chunk_bytes: int | None = None  # None = NCCL's default chunk (surfaces have no chunk)


# prior(collective, nbytes, arms) -> one score per arm, higher = more promising
# (e.g. the policy's log-probability of the configuration).
Prior = Callable[[Collective, int, Sequence[Arm]], Sequence[float]]
# default(collective, nbytes, arms) -> index of NCCL's own pick among arms, or None.
DefaultPick = Callable[[Collective, int, Sequence[Arm]], int | None]
# NCCL's time estimate of every (algo, proto) of a call: what the sidecar's pair probes
# are gated by (online/probes.py)
Estimate = Callable[[Collective, int], dict[tuple[Algo, Proto], float]]


class Config(BaseModel):
    """One `bench tune` configuration's JSON-able description."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algo: Algo
    proto: Proto
    nchannels: int | None
    time_us: float
    chunk_bytes: int | None = None


class BucketResult(BaseModel):
    """One bucket of the `bench tune` JSON output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    nbytes: int
    chosen: Config
    best: Config
    nccl_default: Config | None
    regret: float
    configurations: int = Field(description="rows of the surface in this bucket")
    candidates: int = Field(description="arms the tuner explored (prior's top + default)")
    prior_rank_of_best: int = Field(description="rank the prior gave the best row (0 = top)")
    calls: int
    reverted: bool
    changes: int
    exploration_cost: float = Field(
        description="mean time over all `calls` (each call's configuration's mean time) / best - 1"
    )
    slowest_played: float = Field(
        description="mean time of the slowest configuration any call played / best"
    )
    slowest_calls: int = Field(description="calls that played that slowest configuration")


class TuneReport(BaseModel):
    """The whole `bench tune --json` document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int
    budget: int
    max_candidates: int
    buckets: list[BucketResult]
    mean_regret: float
    max_regret: float
    within_3pct: float = Field(description="fraction of buckets with regret <= 3 %")
    mean_exploration_cost: float = Field(
        description="mean over buckets of `exploration_cost`: what the calls of the budget cost"
    )
    max_exploration_cost: float


def _config(arm: Arm) -> Config:
    return Config(
        algo=arm.algo,
        proto=arm.proto,
        nchannels=arm.nchannels,
        time_us=arm.time_us,
        chunk_bytes=arm.chunk_bytes,
    )


def measure(arm: Arm, rng: np.random.Generator) -> float:
    """One call's measured time: normal around the row's mean with its stddev (floored)."""
    return max(float(rng.normal(arm.time_us, arm.stddev_us)), arm.time_us * 1e-3)


def _play(
    tuner: BucketTuner, arm: Arm, k: int, rng: np.random.Generator, played: list[float]
) -> None:
    """One call of arm `k` (`arm`): its mean time to `played`, a measured time to the tuner."""
    played.append(arm.time_us)
    tuner.observe(k, measure(arm, rng))


def _run(
    tuner: BucketTuner,
    arms: Sequence[Arm],
    idx: Sequence[int],
    calls: range,
    rng: np.random.Generator,
    *,
    played: list[float],
) -> int:
    """Play `calls` of the tuner's schedule, measuring from the arms' (mean, sd) and
    appending each call's mean time to `played`; an epoch ends every `epoch_calls` calls
    or, earlier, when a look measured an arm far ahead of the committed one
    (`BucketTuner.escape_due`). Returns the calls since the last epoch end."""
    since = 0
    for j in calls:
        k = tuner.arm_for_call(j)
        _play(tuner, arms[idx[k]], k, rng, played)
        since += 1
        if since == tuner.cfg.epoch_calls or tuner.escape_due():
            tuner.end_epoch()
            since = 0
    return since


def _run_rounds(
    tuner: BucketTuner,
    arms: Sequence[Arm],
    idx: Sequence[int],
    rng: np.random.Generator,
    *,
    played: list[float],
    round_calls: int,
) -> None:
    """Play the sidecar's table rounds of `round_calls` calls until the tuner's budget is
    spent: at each round's start the tuner folds if it has an epoch's calls since its last
    fold (sidecar/tuning.py `Tuning.end_round`), and the round runs its plan at the scale of
    the last folded round (`round_plan`); a final fold makes the final choice."""
    e, budget = tuner.cfg.epoch_calls, tuner.cfg.budget_calls or 0
    # enough rounds for the budget's epochs four times over (change alarms re-open it)
    max_rounds = 4 * (budget // e + 2) * -(-e // round_calls)
    since = last = j = 0
    for _ in range(max_rounds):
        if since >= e or (since and tuner.escape_due()):
            tuner.end_epoch()
            last, since = since, 0
            if tuner.budget_spent:
                return
        live = round_plan(tuner.plan, e, last)
        for _ in range(round_calls):
            k = plan_choice(live, tuner.key, j)
            _play(tuner, arms[idx[k]], k, rng, played)
            since, j = since + 1, j + 1
            if tuner.escape_due():
                break  # the sidecar's early round (sidecar/tuning.py `Tuning.escape_due`)
    tuner.end_epoch()


def _nccl_count_rows(arms: Sequence[Arm], scores: Sequence[float]) -> list[int]:
    """Each (algo, proto)'s row with NCCL's channel count (else its best-scored row), the
    pairs in score order: the arms the sidecar adds for pairs its table leaves out."""
    order = sorted(range(len(arms)), key=lambda i: (arms[i].nchannels is not None, -scores[i], i))
    return sorted(
        {(a.algo, a.proto): i for i in reversed(order) for a in (arms[i],)}.values(),
        key=lambda i: (-scores[i], i),
    )


def _measured(tuner: BucketTuner, idx: Sequence[int]) -> set[int]:
    return {idx[k] for k, st in enumerate(tuner.stats) if st.n}


def _race_arms(  # noqa: PLR0917 -- the bucket's candidate set and how to widen it
    collective: Collective,
    nbytes: int,
    arms: Sequence[Arm],
    scores: Sequence[float],
    idx: list[int],
    weights: list[float],
    cfg: TunerConfig,
    *,
    diverse: bool,
    estimate: Estimate | None,
) -> tuple[list[int], list[float]]:
    """The candidate set widened as the sidecar widens a cell's arms (sidecar/tuning.py):
    the pair probes (`RaceConfig.probe_pairs`, in the sidecar's candidate order), then
    every channel variant of the candidates' (algo, proto) pairs."""
    pairs = [(a.algo, a.proto) for a in arms]
    if not diverse and cfg.race.probe_pairs:
        rows = _nccl_count_rows(arms, scores)
        if estimate is not None:
            row_of = {pairs[i]: i for i in rows}
            est = {p: t for p, t in estimate(collective, nbytes).items() if p in row_of}
            have = {pairs[i] for i in idx}
            rows = [row_of[p] for p in probe_order(est, have, cfg.race.probe_reach)]
        idx, weights = with_pair_probes(pairs, rows, idx, weights)
    return with_channel_variants(pairs, idx, weights)


def tune_bucket(
    collective: Collective,
    nbytes: int,
    arms: Sequence[Arm],
    prior: Prior,
    default_pick: DefaultPick,
    *,
    budget: int,
    seed: int,
    cfg: TunerConfig,
    max_candidates: int,
    nranks: int,
    nnodes: int,
    diverse: bool = True,
    estimate: Estimate | None = None,
    round_calls: int | None = None,
) -> BucketResult:
    """Run the online tuner for `budget` calls on one bucket of a surface.

    As the sidecar does: one race (`cfg.race`) on the prior's top `max_candidates`
    (plus NCCL's pick) and every channel variant of their (algo, proto) pairs, which
    the race reaches rung by rung. `diverse=False` is the sidecar's candidate order:
    the policy's most probable configurations; with `RaceConfig.probe_pairs` the pairs
    those leave out are probed as the sidecar probes them: by `estimate` (NCCL's, gated
    as online/probes.py says; without it, every pair in the prior's order).
    `round_calls`: the sidecar's table rounds of that many calls (`_run_rounds`): the
    budget counts at most an epoch per round, so a round longer than an epoch runs more
    calls than `budget`, all in the exploration cost.
    """
    if not arms:
        raise ValueError(f"{collective.value} {nbytes}: no configuration in the surface")
    scores = list(prior(collective, nbytes, arms))
    if len(scores) != len(arms):
        raise ValueError("prior returned a score count different from the arm count")
    default = default_pick(collective, nbytes, arms)
    pairs = [(a.algo, a.proto) for a in arms]
    idx, weights = candidate_set(scores, default, max_candidates, pairs if diverse else None)
    idx, weights = _race_arms(
        collective, nbytes, arms, scores, idx, weights, cfg, diverse=diverse, estimate=estimate
    )
    if cfg.budget_calls is None:  # the race ends its exploration with the budget
        cfg = cfg.model_copy(update={"budget_calls": budget})
    key = CellKey(seed, 0, nranks, nnodes, collective, size_bucket(nbytes))
    rng = np.random.default_rng([seed, collective.nccl_id, nbytes])
    played: list[float] = []
    d = idx.index(default) if default is not None else None
    sub = [arms[i] for i in idx]
    pairs_of, channels = [(a.algo, a.proto) for a in sub], [a.nchannels for a in sub]
    tuner = cell_tuner(pairs_of, channels, weights, d, cfg=cfg, key=key)
    if round_calls is not None:
        _run_rounds(tuner, arms, idx, rng, played=played, round_calls=round_calls)
    elif _run(tuner, arms, idx, range(budget), rng, played=played):
        tuner.end_epoch()  # the budget's last calls end an epoch: the final choice
    return _result(collective, nbytes, arms, scores, default, tuner, idx, played)


def _result(  # noqa: PLR0917 -- the bucket, its prior and the tuner's outcome
    collective: Collective,
    nbytes: int,
    arms: Sequence[Arm],
    scores: Sequence[float],
    default: int | None,
    tuner: BucketTuner,
    idx: Sequence[int],
    played: list[float],
) -> BucketResult:
    """The bucket's result: the tuner's final choice against the surface's best row."""
    chosen = arms[idx[tuner.chosen()]]
    best_i = min(range(len(arms)), key=lambda i: (arms[i].time_us, i))
    best = arms[best_i]
    rank = sorted(range(len(scores)), key=lambda i: (-scores[i], i)).index(best_i)
    return BucketResult(
        collective=collective,
        nbytes=nbytes,
        chosen=_config(chosen),
        best=_config(best),
        nccl_default=_config(arms[default]) if default is not None else None,
        regret=chosen.time_us / best.time_us - 1.0,
        configurations=len(arms),
        candidates=len(_measured(tuner, idx)),
        prior_rank_of_best=rank,
        calls=len(played),
        reverted=tuner.reverted,
        changes=sum(1 for e in tuner.events if e.kind == "change"),
        exploration_cost=float(np.mean(played)) / best.time_us - 1.0,
        slowest_played=max(played) / best.time_us,
        slowest_calls=played.count(max(played)),
    )


def tune_surface(
    buckets: dict[tuple[Collective, int], list[Arm]],
    prior: Prior,
    default_pick: DefaultPick,
    *,
    budget: int,
    seed: int = 0,
    cfg: TunerConfig | None = None,
    max_candidates: int = 8,
    nranks: int = 8,
    nnodes: int = 1,
    diverse: bool = True,
    estimate: Estimate | None = None,
    round_calls: int | None = None,
) -> TuneReport:
    """Tune every bucket of a surface; buckets in (collective id, nbytes) order."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    cfg = cfg or TunerConfig()
    keys = sorted(buckets, key=lambda k: (k[0].nccl_id, k[1]))
    results = [
        tune_bucket(
            c,
            n,
            buckets[(c, n)],
            prior,
            default_pick,
            budget=budget,
            seed=seed,
            cfg=cfg,
            max_candidates=max_candidates,
            nranks=nranks,
            nnodes=nnodes,
            diverse=diverse,
            estimate=estimate,
            round_calls=round_calls,
        )
        for c, n in keys
    ]
    regrets = [r.regret for r in results]
    costs = [r.exploration_cost for r in results]
    return TuneReport(
        seed=seed,
        budget=budget,
        max_candidates=max_candidates,
        buckets=results,
        mean_regret=float(np.mean(regrets)) if regrets else 0.0,
        max_regret=max(regrets, default=0.0),
        within_3pct=sum(r <= 0.03 for r in regrets) / len(regrets) if regrets else 1.0,
        mean_exploration_cost=float(np.mean(costs)) if costs else 0.0,
        max_exploration_cost=max(costs, default=0.0),
    )


# --- adapters: a parsed surface, the learned policy's prior, NCCL's own pick ------------
def surface_arms(surface: Surface) -> dict[tuple[Collective, int], list[Arm]]:
    """The surface's rows as arms, per (collective, nbytes)."""
    return {
        key: [Arm(r.algo, r.proto, r.nchannels, r.time_us, r.stddev_us) for r in rows]
        for key, rows in surface.buckets().items()
    }

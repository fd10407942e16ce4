"""`bench tune --peers`: DynamICCL's online tuner and its peers (peers.py) side by side.

Every strategy runs every bucket of the same surfaces with the same seeds and
the same measurement noise; per strategy: final regret (mean, p90, worst, share
of buckets within 3 %) and exploration cost (mean over buckets of the mean time
of all `budget` calls / best - 1; in the sidecar's rounds, of every call its rounds ran
until the budget was spent: a 128-call round spends one 16-call epoch of the budget).

Surfaces besides the given ones (calibrated simulator or measured):

- `perturbed`: each (algo, proto) scaled by a lognormal 5 % factor and each row
  by 2 %: a reality the prior does not know in detail;
- `prior_wrong`: the prior is wrong where it is sure. ``"favourite"``: the
  (algo, proto) of the prior's first choice runs 25 % slower (a driver or
  fabric regression the policy has not seen); ``"hidden"``: an (algo, proto)
  the prior ranks third or lower becomes 10 % faster than the best (a
  configuration the policy undervalues). A prior that only helps on familiar
  ground shows up on these.
- `default_wrong`: NCCL's own pick runs `factor` x slower than the best configuration
  (1.5x, 2x, 3x in `benchmarks/tune_bench.py --peers`), the best at a distance from it
  drawn per bucket (`DISTANCES`): a neighbour channel count of NCCL's pair, another
  protocol of NCCL's algorithm, or another algorithm the prior ranks third or lower. The
  policy learned where NCCL's model is right, so its first choice is NCCL's pick (1 031
  of the suite's 1 040 buckets): prior and default are wrong together, as where NCCL's
  cost model misjudges a fabric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.eval.bench_tune import Arm, DefaultPick, Estimate, Prior, tune_bucket
from dynamiccl.policy.eval.peers import PEERS, Case, figures
from dynamiccl.policy.online.tuner_config import TunerConfig, sidecar_setting

Buckets = dict[tuple[Collective, int], list[Arm]]
DYNAMICCL: Final = "DynamICCL"
# the sidecar's setting, its plans reaching the calls once per table round: a cell making
# 16 calls a round (a plan per epoch, as the bench's) and a busy one making 128
SIDECAR_ROUNDS: Final = {
    "DynamICCL, sidecar, 16-call rounds": 16,
    "DynamICCL, sidecar, 128-call rounds": 128,
}
SIDECAR: Final = next(iter(SIDECAR_ROUNDS))


class PeerRow(BaseModel):
    """One strategy's figures over every bucket run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: str
    runs: int = Field(description="bucket runs (buckets x seeds)")
    mean_regret: float
    p90_regret: float
    max_regret: float
    within_3pct: float
    exploration_cost: float = Field(description="mean over runs of mean call time / best - 1")


class PeerTable(BaseModel):
    """The `--peers` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: int
    seeds: list[int]
    rows: list[PeerRow]


def _scale(a: Arm, f: float) -> Arm:
    return Arm(a.algo, a.proto, a.nchannels, a.time_us * f, a.stddev_us * f, a.chunk_bytes)


def perturbed(buckets: Buckets, seed: int) -> Buckets:
    """Each (algo, proto) x lognormal 5 %, each row x lognormal 2 % (one draw per pair
    across the surface, in (collective id, nbytes) order)."""
    rng = np.random.default_rng(seed)
    pair: dict[tuple[Algo, Proto], float] = {}
    out: Buckets = {}
    for key in sorted(buckets, key=lambda k: (k[0].nccl_id, k[1])):
        rows = []
        for a in buckets[key]:
            f = pair.setdefault((a.algo, a.proto), float(np.exp(rng.normal(0, 0.05))))
            rows.append(_scale(a, f * float(np.exp(rng.normal(0, 0.02)))))
        out[key] = rows
    return out


def _pair_order(arms: Sequence[Arm], scores: Sequence[float]) -> list[tuple[Algo, Proto]]:
    order: list[tuple[Algo, Proto]] = []
    for i in sorted(range(len(arms)), key=lambda i: (-scores[i], i)):
        if (p := (arms[i].algo, arms[i].proto)) not in order:
            order.append(p)
    return order


def prior_wrong(
    buckets: Buckets, prior: Prior, kind: Literal["favourite", "hidden"], seed: int
) -> Buckets:
    """The bucket's surface where the prior is wrong (module docstring); buckets with a
    single (algo, proto) stay as they are."""
    rng = np.random.default_rng(seed)
    out: Buckets = {}
    for (coll, n), arms in sorted(buckets.items(), key=lambda kv: (kv[0][0].nccl_id, kv[0][1])):
        pairs = _pair_order(arms, list(prior(coll, n, arms)))
        best = min(a.time_us for a in arms)
        if len(pairs) < 2:
            out[(coll, n)] = list(arms)
        elif kind == "favourite":
            out[(coll, n)] = [_scale(a, 1.25) if (a.algo, a.proto) == pairs[0] else a for a in arms]
        else:
            hidden = pairs[int(rng.integers(min(2, len(pairs) - 1), len(pairs)))]
            mine = [a for a in arms if (a.algo, a.proto) == hidden]
            f = 0.9 * best / min(a.time_us for a in mine)
            out[(coll, n)] = [_scale(a, f) if (a.algo, a.proto) == hidden else a for a in arms]
    return out


Distance = Literal["channels", "protocol", "algorithm"]
DISTANCES: Final[tuple[Distance, ...]] = ("channels", "protocol", "algorithm")


def _targets(
    arms: Sequence[Arm], d: int, pairs: Sequence[tuple[Algo, Proto]], rng: np.random.Generator
) -> dict[Distance, list[int]]:
    """The rows that become the best at each distance from NCCL's pick `d` (`pairs`: the
    prior's pair order): a channel count next on the ladder to the count of NCCL's pair
    whose time is nearest NCCL's own (its effective count); every row of a pair with
    NCCL's algorithm and another protocol; every row of a pair with another algorithm
    that the prior ranks third or lower (else its lowest such pair)."""
    algo, proto = arms[d].algo, arms[d].proto
    mine = sorted(
        (i for i, a in enumerate(arms) if (a.algo, a.proto) == (algo, proto) and a.nchannels),
        key=lambda i: arms[i].nchannels or 0,
    )
    out: dict[Distance, list[int]] = {}
    if mine:
        at = min(range(len(mine)), key=lambda k: (abs(arms[mine[k]].time_us - arms[d].time_us), -k))
        steps = [k for k in (at - 1, at + 1) if 0 <= k < len(mine)]
        out["channels"] = [mine[steps[int(rng.integers(len(steps)))]]] if steps else []
    protos = [p for p in pairs if p[0] == algo and p[1] != proto]
    algos = [p for p in pairs if p[0] != algo]
    low = [p for p in algos if pairs.index(p) >= 2] or algos[-1:]
    for dist, choice in (("protocol", protos), ("algorithm", low)):
        if choice:
            pair = choice[int(rng.integers(len(choice)))]
            out[dist] = [i for i, a in enumerate(arms) if (a.algo, a.proto) == pair]  # type: ignore[index]
    return {k: v for k, v in out.items() if v}


def default_wrong(
    buckets: Buckets, prior: Prior, pick: DefaultPick, factor: float, seed: int
) -> tuple[Buckets, dict[tuple[Collective, int], Distance]]:
    """The surface where NCCL's pick is `factor` x slower than the best (module docstring),
    and each changed bucket's distance. What NCCL misjudged runs slower: its channel count
    (its row) at the channels distance, else its whole (algo, proto); the target
    (`_targets`: one row at the channels distance, a whole pair otherwise, its shape kept)
    becomes the best, at T = the lower of its own time and 0.95 x the fastest row that is
    neither target nor slowed; NCCL's pick then runs `factor` x T, the rest of its pair
    the same factor slower (at least T / 0.95); every other row stays as it is. Buckets
    without NCCL's pick or a target stay as they are."""
    rng = np.random.default_rng(seed)
    out: Buckets = {}
    where: dict[tuple[Collective, int], Distance] = {}
    for (coll, n), arms in sorted(buckets.items(), key=lambda kv: (kv[0][0].nccl_id, kv[0][1])):
        d = pick(coll, n, arms)
        if d is None or not (
            targets := _targets(arms, d, _pair_order(arms, list(prior(coll, n, arms))), rng)
        ):
            out[(coll, n)] = list(arms)
            continue
        dist = sorted(targets, key=DISTANCES.index)[int(rng.integers(len(targets)))]
        rows, pair = set(targets[dist]), (arms[d].algo, arms[d].proto)
        slow = (
            {d}
            if dist == "channels"
            else {i for i, a in enumerate(arms) if (a.algo, a.proto) == pair}
        )
        rest = [a.time_us for i, a in enumerate(arms) if i not in rows and i not in slow]
        mine = min(arms[i].time_us for i in rows)
        t = min(mine, 0.95 * min(rest, default=mine))
        g = factor * t / arms[d].time_us
        out[(coll, n)] = [
            _scale(a, t / mine if i in rows else max(g, t / 0.95 / a.time_us) if i in slow else 1.0)
            for i, a in enumerate(arms)
        ]
        out[(coll, n)][d] = _scale(arms[d], g)
        where[(coll, n)] = dist
    return out, where


def run_peers(
    buckets: Buckets,
    prior: Prior,
    pick: DefaultPick,
    *,
    budget: int,
    seed: int,
    nranks: int,
    nnodes: int,
    max_candidates: int = 8,
    cfg: TunerConfig | None = None,
    estimate: Estimate | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """(final regret, exploration cost) of every strategy on every bucket (`estimate`:
    NCCL's, which the sidecar's pair probes are gated by)."""
    cfg = cfg or TunerConfig()
    out: dict[str, list[tuple[float, float]]] = {}
    for (coll, n), arms in sorted(buckets.items(), key=lambda kv: (kv[0][0].nccl_id, kv[0][1])):
        sidecar_cfg = sidecar_setting(cfg)  # as AgentConfig.tuner sets it
        runs: list[tuple[str, bool, TunerConfig, int | None]] = [(DYNAMICCL, True, cfg, None)]
        runs += [(name, False, sidecar_cfg, r) for name, r in SIDECAR_ROUNDS.items()]
        for name, diverse, c, rounds in runs:
            r = tune_bucket(
                coll,
                n,
                arms,
                prior,
                pick,
                budget=budget,
                seed=seed,
                cfg=c,
                max_candidates=max_candidates,
                nranks=nranks,
                nnodes=nnodes,
                diverse=diverse,
                estimate=estimate,
                round_calls=rounds,
            )
            out.setdefault(name, []).append((r.regret, r.exploration_cost))
        case = Case(coll, n, arms, list(prior(coll, n, arms)), pick(coll, n, arms), seed)
        for name, strategy in PEERS.items():
            out.setdefault(name, []).append(figures(case, strategy(case, budget)))
    return out


def peer_table(
    raw: dict[str, list[tuple[float, float]]], budget: int, seeds: Sequence[int]
) -> PeerTable:
    """The per-strategy figures of `run_peers` results (merged over surfaces and seeds)."""
    rows = []
    for name, v in raw.items():
        a = np.array(v, dtype=float).reshape(-1, 2)
        reg = a[:, 0]
        rows.append(
            PeerRow(
                strategy=name,
                runs=len(a),
                mean_regret=float(reg.mean()),
                p90_regret=float(np.quantile(reg, 0.9)),
                max_regret=float(reg.max()),
                within_3pct=float((reg <= 0.03).mean()),
                exploration_cost=float(a[:, 1].mean()),
            )
        )
    return PeerTable(budget=budget, seeds=list(seeds), rows=rows)


def render(table: PeerTable, title: str = "") -> str:
    """The table as text (percentages)."""
    lines = [title] if title else []
    lines.append(
        f"{'strategy':<36} {'runs':>5} {'mean %':>7} {'p90 %':>7} {'worst %':>8} "
        f"{'<=3 %':>6} {'explore cost %':>15}"
    )
    for r in table.rows:
        lines.append(
            f"{r.strategy:<36} {r.runs:>5} {r.mean_regret * 100:7.2f} {r.p90_regret * 100:7.2f} "
            f"{r.max_regret * 100:8.2f} {r.within_3pct * 100:6.1f} {r.exploration_cost * 100:15.2f}"
        )
    return "\n".join(lines)

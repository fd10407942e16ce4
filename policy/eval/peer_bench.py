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

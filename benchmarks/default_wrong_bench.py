"""Where NCCL's default is badly wrong (issue 31): what DynamICCL's exploration pays, per
distance of the best from NCCL's pick, against AutoCCL-style coordinate descent, and where
the cost goes (NCCL's default's calls per epoch).

Reproduce:  .venv/bin/python benchmarks/default_wrong_bench.py [--seeds 2] [--factors 1.5,2,3]
            [--perturbed] [--json]
            .venv/bin/python benchmarks/default_wrong_bench.py --trace TOPOLOGY,COLLECTIVE,BYTES
            [--factors 3] [--seed 0]

The surfaces of `bench tune --peers`' default-wrong kinds (`peer_bench.default_wrong` on
the perturbed surfaces of every suite topology: NCCL's pick, and the prior's first choice
with it, `factor` x slower than the best; the best a channel count, a protocol or an
algorithm away), 200 calls per bucket, the same seeds and draws for every strategy
(`peer_bench.run_peers`'s settings: DynamICCL as `bench tune` runs it and as the sidecar
does in 16-call rounds; coordinate descent from NCCL's pick). Per (factor, distance): the
mean exploration cost over the bucket runs, the worst seed's mean, how many topologies'
mean is above coordinate descent's, and NCCL's default's calls per epoch (16 calls): the
first epoch's plan is made before anything is measured, so its committed arm, NCCL's pick,
takes every call its first looks do not. `--perturbed` adds the perturbed surfaces (the
row the change must not make worse). `--trace`: one bucket run of the first factor's
surface (`--perturbed`: the perturbed one), every arm's calls per epoch in each DynamICCL row
(where the calls go over time).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dynamiccl.policy.eval import bench_tune as bt
from dynamiccl.policy.eval import peer_bench as pb
from dynamiccl.policy.eval.decider_views import nccl_estimate, nccl_pick, policy_prior
from dynamiccl.policy.eval.peers import Case, coordinate_descent, figures
from dynamiccl.policy.eval.suite import suite_specs
from dynamiccl.policy.online.tuner_config import TunerConfig, sidecar_setting
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.sim.simulator import NoiseModel, Simulator
from dynamiccl.policy.sim.surface import generate
from dynamiccl.policy.train.inference import Policy

BUDGET = 200
EPOCHS = 4  # NCCL's default's calls in epochs 0, 1, 2 and 3 or later
# (name, diverse candidates, config, table-round calls): run_peers' DynamICCL rows
ROWS = (
    (pb.DYNAMICCL, True, TunerConfig(), None),
    (pb.SIDECAR, False, sidecar_setting(TunerConfig()), 16),
)
CD = "coordinate descent"


class _Calls:
    """The arms `bench_tune` plays, in order (`tune_bucket` is driven as the bench drives
    it; only its per-call hook is wrapped, to count NCCL's default's calls per epoch)."""

    def __init__(self) -> None:
        self.arms: list[bt.Arm] = []
        self._play = bt._play

        def play(tuner: Any, arm: bt.Arm, k: int, rng: Any, played: list[float]) -> None:
            self.arms.append(arm)
            self._play(tuner, arm, k, rng, played)

        bt._play = play

    def per_epoch(self, default: bt.Arm, epoch_calls: int) -> list[int]:
        out = [0] * EPOCHS
        for j, a in enumerate(self.arms):
            if a is default:
                out[min(j // epoch_calls, EPOCHS - 1)] += 1
        return out


def _bucket(
    calls: _Calls, arms: Sequence[bt.Arm], key: Any, ctx: dict[str, Any], seed: int
) -> dict[str, Any]:
    coll, n = key
    prior, pick = ctx["prior"], ctx["pick"]
    d = pick(coll, n, arms)
    rec: dict[str, Any] = {}
    for name, diverse, cfg, rounds in ROWS:
        calls.arms.clear()
        r = bt.tune_bucket(
            coll, n, arms, prior, pick, budget=BUDGET, seed=seed, cfg=cfg, max_candidates=8,
            nranks=ctx["ranks"], nnodes=ctx["nodes"], diverse=diverse,
            estimate=ctx["estimate"], round_calls=rounds,
        )  # fmt: skip
        epochs = calls.per_epoch(arms[d], cfg.epoch_calls) if d is not None else [0] * EPOCHS
        rec[name] = {"regret": r.regret, "cost": r.exploration_cost, "default_calls": epochs}
    case = Case(coll, n, arms, list(prior(coll, n, arms)), d, seed)
    got = coordinate_descent(case, BUDGET)
    regret, cost = figures(case, got)
    epochs = [0] * EPOCHS
    for j, t in enumerate(got.played):  # a call's mean time tells its arm (NCCL's is slowed)
        epochs[min(j // 16, EPOCHS - 1)] += d is not None and t == arms[d].time_us
    rec[CD] = {"regret": regret, "cost": cost, "default_calls": epochs}
    return rec


def run(seeds: int, factors: Sequence[float], perturbed: bool) -> list[dict[str, Any]]:
    """One record per (topology, seed, kind, bucket)."""
    torch.set_num_threads(1)
    pol, calls, out = Policy.load(), _Calls(), []
    kinds: list[float | None] = [*factors, *([None] if perturbed else [])]
    for _, spec in suite_specs():
        base = bt.surface_arms(generate(Simulator(spec, noise=NoiseModel(stddev=0.04))))
        dec = Decider.of(pol, spec)
        ctx: dict[str, Any] = {
            "prior": policy_prior(dec),
            "pick": nccl_pick(dec),
            "estimate": nccl_estimate(dec),
            "ranks": dec.ctx.system.ranks,
            "nodes": dec.ctx.system.nodes,
        }
        for seed in range(seeds):
            for f in kinds:
                surf = pb.perturbed(base, seed)
                where: dict[Any, str] = {}
                if f is not None:
                    surf, dw = pb.default_wrong(surf, ctx["prior"], ctx["pick"], f, seed)
                    where = dict(dw)
                for key in sorted(surf, key=lambda k: (k[0].nccl_id, k[1])):
                    if f is not None and key not in where:
                        continue  # NCCL's pick not slowed here (no target)
                    rec = _bucket(calls, surf[key], key, ctx, seed)
                    kind = "perturbed" if f is None else f"{f:g}x"
                    out.append({"topology": spec.name, "seed": seed, "kind": kind,
                                "distance": where.get(key, "-"), **rec})  # fmt: skip
    return out


def trace(topology: str, coll: str, nbytes: int, factor: float | None, seed: int) -> str:
    """Every arm's calls per 16-call epoch (0..11, then 12 and later) in one bucket run of
    each DynamICCL row, slowest last, with the arm's time over the best."""
    torch.set_num_threads(1)
    spec = next(s for _, s in suite_specs() if s.name == topology)
    base = bt.surface_arms(generate(Simulator(spec, noise=NoiseModel(stddev=0.04))))
    dec = Decider.of(Policy.load(), spec)
    prior, pick = policy_prior(dec), nccl_pick(dec)
    surf = pb.perturbed(base, seed)
    if factor is not None:
        surf = pb.default_wrong(surf, prior, pick, factor, seed)[0]
    key = next(k for k in surf if k[0].value == coll and k[1] == nbytes)
    arms, calls = surf[key], _Calls()
    d, best = pick(*key, arms), min(a.time_us for a in arms)
    lines = [f"{topology} {coll} {nbytes} B, seed {seed}, NCCL's default {factor or 1:g}x"]
    for name, diverse, cfg, rounds in ROWS:
        calls.arms.clear()
        r = bt.tune_bucket(
            *key, arms, prior, pick, budget=BUDGET, seed=seed, cfg=cfg, max_candidates=8,
            nranks=dec.ctx.system.ranks, nnodes=dec.ctx.system.nodes, diverse=diverse,
            estimate=nccl_estimate(dec), round_calls=rounds,
        )  # fmt: skip
        lines.append(f"  {name}: cost {r.exploration_cost:.2%}, regret {r.regret:.2%}")
        per: dict[int, list[int]] = {}
        ids = {id(a): i for i, a in enumerate(arms)}
        for j, a in enumerate(calls.arms):
            per.setdefault(ids[id(a)], [0] * 13)[min(j // cfg.epoch_calls, 12)] += 1
        for i in sorted(per, key=lambda i: arms[i].time_us):
            a, mark = arms[i], " (NCCL's pick)" if i == d else ""
            label = f"{a.algo.value}/{a.proto.value}/{a.nchannels or 'nccl'}"
            row = " ".join(f"{c:2d}" for c in per[i])
            lines.append(f"    {label:<22} {a.time_us / best:5.2f}x  {row}{mark}")
    case = Case(*key, arms, list(prior(*key, arms)), d, seed)
    lines.append(f"  {CD}: cost {figures(case, coordinate_descent(case, BUDGET))[1]:.2%}")
    return "\n".join(lines)


def summary(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (kind, distance) and per kind: every row's mean cost, worst seed's mean cost,
    mean / worst regret, topologies above coordinate descent, default's calls per epoch."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["kind"], r["distance"]), []).append(r)
        if r["distance"] != "-":
            groups.setdefault((r["kind"], "all"), []).append(r)
    out = []
    for (kind, dist), v in sorted(groups.items()):
        row: dict[str, Any] = {"kind": kind, "distance": dist, "runs": len(v)}
        for name in [*(n for n, *_ in ROWS), CD]:
            seeds = sorted({r["seed"] for r in v})
            topo = sorted({r["topology"] for r in v})

            def mean(rs: Sequence[dict[str, Any]], who: str = name) -> float:
                return float(np.mean([r[who]["cost"] for r in rs]))

            reg = [r[name]["regret"] for r in v]
            per_topo = [[r for r in v if r["topology"] == x] for x in topo]
            row[name] = {
                "cost": mean(v),
                "worst_seed_cost": max(mean([r for r in v if r["seed"] == s]) for s in seeds),
                "mean_regret": float(np.mean(reg)),
                "max_regret": float(np.max(reg)),
                "topologies_above_cd": sum(mean(t) > mean(t, CD) for t in per_topo),
                "default_calls_per_epoch": np.mean([r[name]["default_calls"] for r in v], 0)
                .round(2)
                .tolist(),
            }
        out.append(row)
    return out


def render(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "kind  distance   runs | strategy: cost % (worst seed) / regret mean, max % / "
        "topologies above CD / NCCL default's calls in epochs 0, 1, 2, 3+"
    ]
    for r in rows:
        lines.append(f"{r['kind']:<9} {r['distance']:<9} {r['runs']:>5}")
        for name in [*(n for n, *_ in ROWS), CD]:
            m = r[name]
            lines.append(
                f"    {name:<36} {m['cost'] * 100:6.2f} ({m['worst_seed_cost'] * 100:6.2f}) / "
                f"{m['mean_regret'] * 100:5.2f}, {m['max_regret'] * 100:6.2f} / "
                f"{m['topologies_above_cd']:>2} / {m['default_calls_per_epoch']}"
            )
    return "\n".join(lines)


def _args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1 (default 2)")
    ap.add_argument(
        "--factors", default="1.5,2,3", help="how much slower NCCL's default is (comma list)"
    )
    ap.add_argument("--perturbed", action="store_true", help="add the perturbed surfaces")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    ap.add_argument(
        "--trace", metavar="TOPOLOGY,COLLECTIVE,BYTES", help="one bucket run, calls per epoch"
    )
    ap.add_argument("--seed", type=int, default=0, help="with --trace: the seed")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    a = _args(argv)
    factors = [float(x) for x in a.factors.split(",")]
    given = " ".join(argv if argv is not None else sys.argv[1:])
    if a.trace:
        topo, coll, nb = a.trace.split(",")
        print("command: benchmarks/default_wrong_bench.py " + given)
        print(trace(topo, coll, int(nb), None if a.perturbed else factors[0], a.seed))
        return
    rows = summary(run(a.seeds, factors, a.perturbed))
    if a.json:
        print(
            json.dumps(
                {"command": "benchmarks/default_wrong_bench.py " + given, "rows": rows}, indent=2
            )
        )
    else:
        print("command: benchmarks/default_wrong_bench.py " + given)
        print(render(rows))


if __name__ == "__main__":
    main()

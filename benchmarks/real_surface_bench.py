"""The product's online tuner on real NCCL's measured surface (one H200, NCCL 2.28.9).

Reproduce:  nice -n 19 .venv/bin/python benchmarks/real_surface_bench.py [--ranks 2 4]
            [--seeds 5] [--budgets 50,100,200,500,1000] [--json]

What runs: `dynamiccl bench tune`'s `tune_bucket` (policy/eval/bench_tune.py), which builds
the sidecar's tuner (`online.cell_tuner`, the race of sidecar/tuning.py), on every
(collective, nbytes) of `benchmarks/gpu/2026-11-28-h200/surface-N.csv`: the shipped
model's prior for examples/topology-1gpu-tcp.yaml with `nodes: N` (the cluster the GPU run
was), each call's time drawn from the measured row's mean and standard deviation. The
measured surface stands in for NCCL (the one stand-in); configurations it lacks (ruled out
by NCCL, cut by the sweep's deadline) are not offered (policy/eval/measured_surface.py).

Three settings: `bench tune`'s (the CLI's: the prior's best row of every pair and its top 8,
with their channel ladders) and the sidecar's (sidecar/tuning.py: the policy's most probable
configurations, a probe of every other pair NCCL's estimate puts within reach, in table
rounds of 16 or 128 calls). Two defaults, i.e. which arm is "NCCL's own pick": `real`
(what NCCL chose in the run, `nccl-pick-N.csv`) and `model` (the product's re-implementation
of NCCL's cost model, `Decider.nccl_choice`: what `dynamiccl bench tune --surface` uses;
the sidecar's `baseline.NcclDefaults` asks the same model). The pair probes are gated by the
model's estimate in both (the run did not record NCCL's cost table).

Figures, against real NCCL's measured pick (what the job pays without DynamICCL):
- departure buckets (the best row >= 5 % faster than NCCL's pick): share of seeds whose final
  choice is within 3 % of the best, the final speedup over NCCL's pick, and what the budget's
  calls cost over NCCL's pick (mean call time / NCCL's pick - 1);
- every bucket: the final choice's speedup over NCCL's pick (geometric mean, worst), the
  exploration cost over NCCL's pick (mean, worst bucket), and the slowest configuration any
  call played (x the bucket's best) with how many calls played it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.nccl import Collective
from dynamiccl.api.topology import load_topology
from dynamiccl.policy.eval.bench_tune import BucketResult, DefaultPick, Estimate, Prior, tune_bucket
from dynamiccl.policy.eval.decider_views import nccl_estimate, nccl_pick, policy_prior
from dynamiccl.policy.eval.measured_surface import MeasuredSurface, load_measured
from dynamiccl.policy.eval.peer_bench import SIDECAR_ROUNDS
from dynamiccl.policy.online.tuner_config import TunerConfig, sidecar_setting
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.ranker import load_ranker

ROOT: Final = Path(__file__).resolve().parents[1]
RUN: Final = ROOT / "benchmarks" / "gpu" / "2026-11-28-h200"
TOPOLOGY: Final = ROOT / "examples" / "topology-1gpu-tcp.yaml"
DEPARTURE_GAIN: Final = 0.05  # a bucket departs where its best row is this much faster
FOUND: Final = 0.03  # a final choice within 3 % of the best found it (`bench tune`'s line)
Key = tuple[Collective, int]


@dataclass(frozen=True)
class Setup:
    """One rank count's surface and what the product's policy says about it."""

    ranks: int
    measured: MeasuredSurface
    prior: Prior
    picks: dict[str, DefaultPick]
    estimate: Estimate
    nnodes: int


def setup(ranks: int) -> Setup:
    """The measured surface of `ranks` ranks and the shipped model's decider for it."""
    ms = load_measured(RUN / f"surface-{ranks}.csv", RUN / f"nccl-pick-{ranks}.csv")
    spec = load_topology(TOPOLOGY).model_copy(update={"nodes": ranks})
    decider = Decider.of(load_ranker(None), spec)
    picks = {"real": ms.pick(), "model": nccl_pick(decider)}
    return Setup(ranks, ms, policy_prior(decider), picks, nccl_estimate(decider), ranks)


def settings() -> dict[str, dict[str, Any]]:
    """`bench tune`'s setting and the sidecar's (module docstring)."""
    side = sidecar_setting(TunerConfig())
    out: dict[str, dict[str, Any]] = {"bench tune": {"diverse": True, "cfg": TunerConfig()}}
    for name, calls in SIDECAR_ROUNDS.items():
        out[name] = {"diverse": False, "cfg": side, "round_calls": calls}
    return out


def name_of(cfg: Any) -> str:
    """algo/proto/channels ('-': NCCL's count) of a `bench_tune.Config` or `Arm`."""
    return f"{cfg.algo.value}/{cfg.proto.value}/{cfg.nchannels or '-'}"


def pick_differences(s: Setup) -> list[dict[str, Any]]:
    """Buckets where the cost model's pick is another (algo, proto) than NCCL's real one."""
    out = []
    for (coll, n), arms in sorted(s.measured.buckets.items(), key=lambda kv: kv[0][1]):
        real, model = s.picks["real"](coll, n, arms), s.picks["model"](coll, n, arms)
        if real is None or model is None:
            continue
        a, b = arms[real], arms[model]
        if (a.algo, a.proto) != (b.algo, b.proto):
            out.append({"bucket": f"{coll.value} {n}", "real": name_of(a), "model": name_of(b),
                        "model_pick_x_real": b.time_us / a.time_us})  # fmt: skip
    return out


def departures(ms: MeasuredSurface) -> list[Key]:
    """Buckets whose best row is `DEPARTURE_GAIN` or more faster than NCCL's measured pick."""
    return [
        k
        for k, arms in ms.buckets.items()
        if k in ms.picks
        and ms.picks[k].time_us >= (1 + DEPARTURE_GAIN) * min(a.time_us for a in arms)
    ]


def run(
    s: Setup, pick: str, setting: dict[str, Any], budget: int, seed: int
) -> dict[Key, BucketResult]:
    """Every bucket of the surface, tuned with `budget` calls."""
    return {
        (c, n): tune_bucket(
            c,
            n,
            arms,
            s.prior,
            s.picks[pick],
            budget=budget,
            seed=seed,
            max_candidates=8,
            nranks=s.ranks,
            nnodes=s.nnodes,
            estimate=s.estimate,
            **setting,
        )
        for (c, n), arms in s.measured.buckets.items()
    }


def versus_nccl(r: BucketResult, nccl_us: float) -> tuple[float, float]:
    """(final choice's speedup over NCCL's pick, the calls' cost over NCCL's pick)."""
    return nccl_us / r.chosen.time_us, (1 + r.exploration_cost) * r.best.time_us / nccl_us - 1


def summary(s: Setup, runs: Sequence[dict[Key, BucketResult]]) -> dict[str, Any]:
    """One (pick, setting, budget)'s figures over seeds (module docstring)."""
    nccl = {k: a.time_us for k, a in s.measured.picks.items()}
    dep: dict[str, Any] = {}
    for k in departures(s.measured):
        rs = [r[k] for r in runs]
        vs = [versus_nccl(r, nccl[k]) for r in rs]
        dep[f"{k[0].value} {k[1]}"] = {
            "found": sum(r.regret <= FOUND for r in rs) / len(rs),
            "chosen": dict(Counter(name_of(r.chosen) for r in rs)),
            "speedup": sum(v[0] for v in vs) / len(vs),
            "cost_vs_nccl": sum(v[1] for v in vs) / len(vs),
        }
    every = [(r, *versus_nccl(r, nccl[k])) for run_ in runs for k, r in run_.items() if k in nccl]
    slow = max(every, key=lambda e: (e[0].slowest_played, e[0].slowest_calls))[0]
    costly = max(every, key=lambda e: e[2])[0]
    return {
        "departures": dep,
        "speedup_geomean": math.exp(sum(math.log(e[1]) for e in every) / len(every)),
        "speedup_worst": min(e[1] for e in every),
        "cost_vs_nccl_mean": sum(e[2] for e in every) / len(every),
        "cost_vs_nccl_worst": max(e[2] for e in every),
        "cost_worst_where": f"{costly.collective.value} {costly.nbytes}",
        "slowest_played": slow.slowest_played,
        "slowest_calls": slow.slowest_calls,
        "slowest_where": f"{slow.collective.value} {slow.nbytes}",
        "calls_on_10x": sum(r.slowest_calls for r, _, _ in every if r.slowest_played >= 10),
        "bucket_runs": len(every),
    }


def bench(ranks: Sequence[int], seeds: int, budgets: Sequence[int]) -> dict[str, Any]:
    """Every rank count x default x setting x budget."""
    out: dict[str, Any] = {"seeds": seeds, "budgets": list(budgets), "ranks": {}}
    for n in ranks:
        s = setup(n)
        doc: dict[str, Any] = {
            "departures": [f"{k[0].value} {k[1]}" for k in departures(s.measured)],
            "model_vs_real_pick": pick_differences(s),
            "runs": {},
        }
        for pick in s.picks:
            for name, setting in settings().items():
                for b in budgets:
                    runs = [run(s, pick, setting, b, seed) for seed in range(seeds)]
                    doc["runs"][f"{pick} pick | {name} | {b} calls"] = summary(s, runs)
        out["ranks"][str(n)] = doc
    return out


def render(doc: dict[str, Any]) -> str:
    """The figures as text (percentages)."""
    lines = []
    for n, d in doc["ranks"].items():
        lines.append(f"== {n} ranks: departure buckets {', '.join(d['departures']) or 'none'}")
        for p in d["model_vs_real_pick"]:
            lines.append(f"   cost model picks {p['model']} where NCCL ran {p['real']} "
                         f"({p['bucket']}: {p['model_pick_x_real']:.2f}x its time)")  # fmt: skip
        for label, r in d["runs"].items():
            found = " ".join(
                f"[{k}: found {v['found'] * 100:.0f} %, x{v['speedup']:.3f}, "
                f"cost {v['cost_vs_nccl'] * 100:+.1f} %, {v['chosen']}]"
                for k, v in r["departures"].items()
            )
            cost = (
                f"cost {r['cost_vs_nccl_mean'] * 100:+.2f} % (worst "
                f"{r['cost_vs_nccl_worst'] * 100:+.1f} %, {r['cost_worst_where']})"
            )
            lines.append(
                f"{label}: all buckets x{r['speedup_geomean']:.4f} "
                f"(worst x{r['speedup_worst']:.3f}), {cost}, slowest played "
                f"{r['slowest_played']:.1f}x best x {r['slowest_calls']} calls "
                f"({r['slowest_where']}), calls on >=10x points {r['calls_on_10x']}\n    {found}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budgets", default="50,100,200,500,1000")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    budgets = [int(x) for x in a.budgets.split(",")]
    if a.seeds < 1 or not budgets or min(budgets) < 1:
        ap.error("--seeds and every budget must be >= 1")
    doc = bench(a.ranks, a.seeds, budgets)
    doc["command"] = "benchmarks/real_surface_bench.py " + " ".join(argv or [])
    print(json.dumps(doc, indent=2) if a.json else f"command: {doc['command']}\n{render(doc)}")
    return doc


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

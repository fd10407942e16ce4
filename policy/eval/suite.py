"""The benchmark suite: the learned policy against NCCL's default and the oracle.

13 topologies (single-node NVSwitch with and without NVLS, a 5-GPU NVLS
team, PCIe-only, multi-node InfiniBand / RoCE / EFA from 2 to 64 nodes,
SHARP, a cross-container split, Blackwell) x the five collectives x sizes
8 B .. 16 GiB (every power of two). Every time is the calibrated simulator's
mean for the configuration; nothing here is tuned to the suite (the policy
never saw these exact specs, and the simulator is the one `sim calibrate`
grounds). Two policies are measured:

- static: the compiled table's first choice (greedy policy, no measurements);
- tuned: the online tuner (`online.BucketTuner`) run for `budget` calls per
  bucket over the policy's top candidates plus NCCL's own pick, fed noisy
  simulated measurements (lognormal, 4 %), with the guardrail on; the
  configuration it commits to is then scored by its mean time.

"Differ" = calls where NCCL's own pick is more than 1 % slower than the
simulated optimum, i.e. where NCCL's cost model and (simulated) reality
disagree; every such case traces to a cited departure (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from pydantic import BaseModel, ConfigDict

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologySpec, parse_topology
from dynamiccl.policy.eval.bench_tune import Arm, DefaultPick, Prior, tune_bucket
from dynamiccl.policy.eval.evaluate import Metrics, action_times, metrics
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.dataset import Labelled, concat, label_calls

SIZES: Final = tuple(1 << k for k in range(3, 35))  # 8 B .. 16 GiB
NOISE: Final = 0.04
CANDIDATES: Final = 8


def _node(name: str, gpu: str, gpn: int, nvlink: float, **kw: Any) -> dict[str, Any]:
    base = {
        "name": name,
        "gpu": gpu,
        "gpus_per_node": gpn,
        "nodes": 1,
        "intra": "nvswitch" if nvlink else "pcie",
        "nvlink_GBps": nvlink,
        "nvls": False,
        "pcie_gen": 5,
        "nics_per_node": 0,
        "nic_Gbps": 0,
        "fabric": "none",
        "sharp": False,
    }
    return {**base, **kw}


SUITE: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    ("single node, 8x H100 NVSwitch + NVLS", _node("h100-nvls", "H100", 8, 450, nvls=True)),
    ("single node, 8x H100 NVSwitch, NVLS off", _node("h100-nonvls", "H100", 8, 450)),
    ("single node, 5x H200 NVLS team", _node("h200x5-nvls", "H200", 5, 450, nvls=True)),
    ("single node, 8x A100 NVSwitch", _node("a100-node", "A100", 8, 300, pcie_gen=4)),
    ("single node, 8x L40S PCIe only", _node("l40s-pcie", "L40S", 8, 0, pcie_gen=4)),
    (
        "2 nodes H100, InfiniBand 8x400G",
        _node(
            "h100-ib-2n",
            "H100",
            8,
            450,
            nvls=True,
            nodes=2,
            nics_per_node=8,
            nic_Gbps=400,
            fabric="infiniband",
        ),
    ),
    (
        "8 nodes A100, RoCE 8x200G",
        _node(
            "a100-roce-8n",
            "A100",
            8,
            300,
            pcie_gen=4,
            nodes=8,
            nics_per_node=8,
            nic_Gbps=200,
            fabric="roce",
        ),
    ),
    (
        "4 nodes H100 (p5), EFA 32x100G",
        _node(
            "p5-efa-4n",
            "H100",
            8,
            450,
            nvls=True,
            nodes=4,
            nics_per_node=32,
            nic_Gbps=100,
            fabric="efa",
        ),
    ),
    (
        "16 nodes A100 (p4d), EFA 4x100G",
        _node(
            "p4d-efa-16n",
            "A100",
            8,
            300,
            pcie_gen=4,
            nodes=16,
            nics_per_node=4,
            nic_Gbps=100,
            fabric="efa",
        ),
    ),
    (
        "64 nodes H100, InfiniBand 8x400G",
        _node(
            "h100-ib-64n",
            "H100",
            8,
            450,
            nvls=True,
            nodes=64,
            nics_per_node=8,
            nic_Gbps=400,
            fabric="infiniband",
        ),
    ),
    (
        "16 nodes H100, InfiniBand + SHARP",
        _node(
            "h100-sharp-16n",
            "H100",
            8,
            450,
            nvls=True,
            nodes=16,
            nics_per_node=8,
            nic_Gbps=400,
            fabric="infiniband",
            sharp=True,
        ),
    ),
    (
        "2 nodes A100 split into 4-GPU containers, IB",
        _node(
            "a100-container",
            "A100",
            8,
            300,
            pcie_gen=4,
            nodes=2,
            nics_per_node=4,
            nic_Gbps=200,
            fabric="infiniband",
            container_gpus=4,
        ),
    ),
    (
        "8 nodes B200, InfiniBand 8x400G",
        _node(
            "b200-ib-8n",
            "B200",
            8,
            900,
            nvls=True,
            nodes=8,
            nics_per_node=8,
            nic_Gbps=400,
            fabric="infiniband",
        ),
    ),
)


class CallResult(BaseModel):
    """One (collective, size) of one topology."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    nbytes: int
    nccl_us: float
    oracle_us: float
    static_us: float
    tuned_us: float | None


class TopologyResult(BaseModel):
    """One topology's calls and aggregates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    static: Metrics
    tuned: Metrics | None
    calls: list[CallResult]


class SuiteReport(BaseModel):
    """The whole `bench suite --json` document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: int
    noise: float
    topologies: list[TopologyResult]
    static: Metrics
    tuned: Metrics | None
    targets: dict[str, bool]

    def summary(self) -> str:
        """Human-readable table."""
        lines = [
            f"{'topology':<18} {'static x':>9} {'oracle %':>9} {'tuned x':>8} {'oracle %':>9} "
            f"{'worst':>6} {'differ x':>9} {'of':>6}"
        ]
        rows = [(t.name, t.static, t.tuned) for t in self.topologies]
        rows.append(("OVERALL", self.static, self.tuned))
        for name, s, tu in rows:
            ref = tu or s
            lines.append(
                f"{name:<18} {s.speedup:9.4f} {s.oracle_fraction * 100:9.2f} "
                f"{(tu.speedup if tu else float('nan')):8.4f} "
                f"{(tu.oracle_fraction * 100 if tu else float('nan')):9.2f} "
                f"{ref.worst_speedup:6.3f} {ref.differ_speedup or float('nan'):9.4f} "
                f"{ref.differ_oracle_speedup or float('nan'):6.3f}"
            )
        met = (f"{k}={'met' if v else 'MISSED'}" for k, v in self.targets.items())
        lines.append("targets: " + ", ".join(met))
        return "\n".join(lines)


def suite_specs() -> list[tuple[str, TopologySpec]]:
    """(description, spec) of every suite topology."""
    return [(d, parse_topology(s, source=s["name"])) for d, s in SUITE]


def _tuned_times(
    decider: Decider, sim: Simulator, data: Labelled, budget: int, seed: int
) -> np.ndarray:
    """Mean time of the configuration the online tuner commits to, per call."""
    acts, probs, pick = decider.rank(data.coll, data.nbytes, CANDIDATES)
    out = np.empty(len(data))
    cfg = TunerConfig()
    for i in range(len(data)):
        keys = [tuple(int(x) for x in acts[i, j]) for j in range(CANDIDATES) if probs[i, j] > 0]
        scores = [float(np.log(probs[i, j])) for j in range(CANDIDATES) if probs[i, j] > 0]
        default = (int(pick[i, 0]), int(pick[i, 1]), 0, 0)
        if default not in keys:
            keys.append(default)
            scores.append(min(scores) - 1.0)
        k = np.array(keys)
        t = sim.times(
            np.full(len(k), data.coll[i]),
            np.full(len(k), data.nbytes[i]),
            k[:, 0],
            k[:, 1],
            nch=np.asarray(CHANNEL_OPTIONS)[k[:, 2]],
            chunk=np.asarray(CHUNK_OPTIONS)[k[:, 3]],
        )
        arms = [
            Arm(
                list(Algo)[a[0]],
                list(Proto)[a[1]],
                CHANNEL_OPTIONS[a[2]] or None,
                float(tt),
                NOISE * float(tt),
                CHUNK_OPTIONS[a[3]] or None,
            )
            for a, tt in zip(keys, t, strict=True)
        ]
        res = tune_bucket(
            list(Collective)[int(data.coll[i])],
            int(data.nbytes[i]),
            arms,
            _fixed_scores(scores),
            _fixed_default(keys.index(default)),
            budget=budget,
            seed=seed,
            cfg=cfg,
            max_candidates=len(arms),
            nranks=decider.ctx.system.ranks,
            nnodes=decider.ctx.system.nodes,
        )
        out[i] = res.chosen.time_us
    return out


def _fixed_scores(scores: list[float]) -> Prior:
    def prior(_c: Collective, _n: int, _a: Sequence[Arm]) -> list[float]:
        return scores

    return prior


def _fixed_default(index: int) -> DefaultPick:
    def pick(_c: Collective, _n: int, _a: Sequence[Arm]) -> int | None:
        return index

    return pick


def run_suite(
    policy: Ranker,
    *,
    budget: int = 200,
    seed: int = 0,
    names: Sequence[str] | None = None,
    sizes: Sequence[int] = SIZES,
) -> SuiteReport:
    """Run every topology (or those in `names`); budget 0 skips the online tuner."""
    results = []
    all_data: list[Labelled] = []
    all_static, all_tuned = [], []
    for desc, spec in suite_specs():
        if names is not None and spec.name not in names:
            continue
        decider = Decider.of(policy, spec)
        sim = Simulator(decider.ctx.system)
        coll = np.repeat(np.arange(len(Collective)), len(sizes))
        nbytes = np.tile(np.array(sizes, dtype=np.float64), len(Collective))
        data = label_calls(decider.ctx, sim, coll, nbytes)
        obs, feasible, pick = decider.inputs(data.coll, data.nbytes)
        static = action_times([sim], data, policy.decide(obs, feasible, pick, decider.tau)[0])
        tuned = _tuned_times(decider, sim, data, budget, seed) if budget else None
        all_data.append(data)
        all_static.append(static)
        if tuned is not None:
            all_tuned.append(tuned)
        calls = [
            CallResult(
                collective=list(Collective)[int(data.coll[i])],
                nbytes=int(data.nbytes[i]),
                nccl_us=float(data.nccl_time[i]),
                oracle_us=float(min(data.best_time[i], data.nccl_time[i])),
                static_us=float(static[i]),
                tuned_us=float(tuned[i]) if tuned is not None else None,
            )
            for i in range(len(data))
        ]
        results.append(
            TopologyResult(
                name=spec.name,
                description=desc,
                static=metrics(data, static),
                tuned=metrics(data, tuned) if tuned is not None else None,
                calls=calls,
            )
        )
    merged = concat(all_data)
    static_m = metrics(merged, np.concatenate(all_static))
    tuned_m = metrics(merged, np.concatenate(all_tuned)) if all_tuned else None
    ref = tuned_m or static_m
    targets = {
        "differ_speedup>=1.2": (ref.differ_speedup or 0.0) >= 1.2,
        "oracle_fraction>=0.97": ref.oracle_fraction >= 0.97,
        "never_below_default_by_2pct": ref.below_default_2pct == 0,
    }
    return SuiteReport(
        budget=budget,
        noise=NOISE,
        topologies=results,
        static=static_m,
        tuned=tuned_m,
        targets=targets,
    )


def render(report: SuiteReport, out: Path) -> list[Path]:
    """PNG plots of the report into `out` (matplotlib, Agg)."""
    from dynamiccl.policy.eval.plots import plot_all  # noqa: PLC0415

    return plot_all(report, out)

"""`bench tune`: regret <= 3 % within 200 calls from the policy's prior, on noisy surfaces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.eval import peer_bench
from dynamiccl.policy.eval.bench_tune import (
    Arm,
    Prior,
    surface_arms,
    tune_bucket,
    tune_surface,
)
from dynamiccl.policy.eval.candidates import candidate_set
from dynamiccl.policy.eval.decider_views import nccl_estimate, nccl_pick, policy_prior
from dynamiccl.policy.online.race import RaceConfig
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.sim.simulator import NoiseModel, Simulator
from dynamiccl.policy.sim.surface import Surface, generate
from dynamiccl.policy.train.inference import Policy

TOPOLOGIES: dict[str, dict[str, Any]] = {
    "h200x5": {
        "name": "h200x5",
        "gpu": "H200",
        "gpus_per_node": 5,
        "nodes": 1,
        "intra": "nvswitch",
        "nvlink_GBps": 450,
        "nvls": True,
        "pcie_gen": 5,
        "nics_per_node": 0,
        "nic_Gbps": 0,
        "fabric": "none",
        "sharp": False,
    },
    "p5x2": {
        "name": "p5x2",
        "gpu": "H100",
        "gpus_per_node": 8,
        "nodes": 2,
        "intra": "nvswitch",
        "nvlink_GBps": 450,
        "nvls": True,
        "pcie_gen": 5,
        "nics_per_node": 32,
        "nic_Gbps": 100,
        "fabric": "efa",
        "sharp": False,
    },
}
SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 26, 1 << 30, 1 << 34)


def _perturbed(surface: Surface, seed: int) -> Surface:
    """Reality off the simulator: +-5 % per (algo, proto), +-2 % per row."""
    rng = np.random.default_rng(seed)
    pair: dict[tuple[Algo, Proto], float] = {}
    rows = []
    for r in surface.rows:
        f = pair.setdefault((r.algo, r.proto), float(np.exp(rng.normal(0, 0.05))))
        f *= float(np.exp(rng.normal(0, 0.02)))
        rows.append(r.model_copy(update={"time_us": r.time_us * f, "stddev_us": r.stddev_us * f}))
    return Surface(rows=tuple(rows))


@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("perturb", [False, True])
def test_regret_within_3pct_in_200_calls(name: str, perturb: bool) -> None:
    spec = parse_topology(TOPOLOGIES[name])
    surface = generate(Simulator(spec, noise=NoiseModel(stddev=0.04)), sizes=SIZES)
    if perturb:
        surface = _perturbed(surface, 1)
    arms = surface_arms(surface)
    allreduce = [len(v) for (c, _), v in arms.items() if c is Collective.ALLREDUCE]
    assert 50 <= min(allreduce) <= max(allreduce) <= 100
    assert all(r.stddev_us == pytest.approx(0.04 * r.time_us, rel=0.01) for r in surface.rows[:50])
    decider = Decider.of(Policy.load(), spec)
    report = tune_surface(
        arms,
        policy_prior(decider),
        nccl_pick(decider),
        budget=200,
        seed=0,
        nranks=decider.ctx.system.ranks,
        nnodes=decider.ctx.system.nodes,
    )
    worst = [(b.collective.value, b.nbytes, round(b.regret, 4)) for b in report.buckets]
    # the bar, on simulator surfaces (4 % noise) and on reality off the prior by
    # 5 % per pair and 2 % per row alike
    assert report.max_regret <= 0.03, [w for w in worst if w[2] > 0.03]
    assert report.mean_regret <= 0.01
    # Not exhaustive: the prior's top 8 + NCCL's pick, then the leader's variants.
    assert all(b.candidates < b.configurations for b in report.buckets if b.configurations > 20)
    assert all(b.nccl_default is not None for b in report.buckets)


# --- the tuner does the work, and a wrong prior shows -----------------------------------
def _synthetic(n: int, rng: np.random.Generator) -> list[Arm]:
    t = 100 * np.exp(rng.normal(0, 0.15, n))
    return [Arm(Algo.RING, Proto.SIMPLE, i + 1, float(x), 0.04 * float(x)) for i, x in enumerate(t)]


def _score_by(true_rank_noise: float, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    def prior(_c: Collective, _n: int, arms: Sequence[Arm]) -> list[float]:
        return [-np.log(a.time_us) / 0.02 + rng.normal(0, true_rank_noise) for a in arms]

    return prior


def _fixed_prior(scores: Sequence[float]) -> Prior:
    """A prior that answers `scores` whatever it is asked."""
    return lambda _c, _n, _a: scores


def test_tuning_beats_the_priors_first_guess() -> None:
    rng = np.random.default_rng(2)
    tuned, first = [], []
    for i in range(20):
        arms = _synthetic(60, rng)
        prior = _score_by(2.0, rng)  # a noisy ranking: its top pick is often not the best
        scores = prior(Collective.ALLREDUCE, 1, arms)
        best = min(a.time_us for a in arms)
        first.append(arms[int(np.argmax(scores))].time_us / best - 1)
        res = tune_bucket(
            Collective.ALLREDUCE,
            1 << 20,
            arms,
            _fixed_prior(scores),
            lambda _c, _n, _a: 0,
            budget=200,
            seed=i,
            cfg=TunerConfig(),
            max_candidates=8,
            nranks=8,
            nnodes=1,
        )
        tuned.append(res.regret)
    assert np.mean(tuned) < np.mean(first)
    assert max(tuned) <= 0.03


def test_a_prior_that_hides_the_best_costs_regret() -> None:
    rng = np.random.default_rng(3)
    arms = _synthetic(60, rng)
    wrong = [np.log(a.time_us) for a in arms]  # ranks the fastest last
    res = tune_bucket(
        Collective.ALLREDUCE,
        1 << 20,
        arms,
        lambda _c, _n, _a: wrong,
        lambda _c, _n, _a: None,
        budget=200,
        seed=0,
        cfg=TunerConfig(),
        max_candidates=8,
        nranks=8,
        nnodes=1,
    )
    assert res.regret > 0.1
    assert res.prior_rank_of_best == 59


def test_per_pair_diversity_reaches_a_pair_the_probability_order_misses() -> None:
    """The prior loves 12 channel variants of ring/simple; the fastest is tree/simple,
    ranked 13th. In probability order (what the sidecar's table holds) 8 candidates
    never include it: without pair probes the tuner never tries it; one slot per
    (algo, proto), or the sidecar's probe of every pair the table leaves out
    (`RaceConfig.probe_pairs`, on in `sidecar_setting`), reaches it and the tuner finds
    it."""
    ring = [Arm(Algo.RING, Proto.SIMPLE, c, 100.0 + c, 4.0) for c in range(1, 13)]
    arms = [*ring, Arm(Algo.TREE, Proto.SIMPLE, 4, 80.0, 3.2)]
    scores = [10.0 - 0.1 * i for i in range(12)] + [8.0]
    common: dict[str, Any] = {
        "budget": 200,
        "seed": 0,
        "cfg": TunerConfig(),
        "max_candidates": 8,
        "nranks": 8,
        "nnodes": 1,
    }
    pick = lambda _c, _n, _a: 0  # noqa: E731 - NCCL's pick: the first ring variant
    args = (Collective.ALLREDUCE, 1 << 20, arms, _fixed_prior(scores), pick)
    probe = TunerConfig(race=RaceConfig(probe_pairs=True))
    unprobed = tune_bucket(*args, diverse=False, **common)
    by_probability = tune_bucket(*args, diverse=False, **{**common, "cfg": probe})
    diverse = tune_bucket(*args, **common)
    assert unprobed.chosen.algo is Algo.RING
    assert unprobed.regret > 0.2
    assert by_probability.chosen.algo is Algo.TREE
    assert by_probability.regret == 0.0
    assert diverse.chosen.algo is Algo.TREE
    assert diverse.regret == 0.0


def test_candidate_set_adds_the_default() -> None:
    idx, w = candidate_set([3.0, 2.0, 1.0, 0.0], default=3, max_candidates=2)
    assert idx == [0, 1, 3]
    assert w[0] == 1.0
    assert w[1] == pytest.approx(np.exp(-1.0))


def test_empty_bucket_and_bad_budget() -> None:
    with pytest.raises(ValueError, match="no configuration"):
        tune_bucket(
            Collective.ALLREDUCE,
            8,
            [],
            lambda _c, _n, _a: [],
            lambda _c, _n, _a: None,
            budget=1,
            seed=0,
            cfg=TunerConfig(),
            max_candidates=1,
            nranks=2,
            nnodes=1,
        )
    with pytest.raises(ValueError, match="budget"):
        tune_surface({}, lambda _c, _n, _a: [], lambda _c, _n, _a: None, budget=0)


def test_the_tuner_explores_for_less_than_coordinate_descent() -> None:
    """The shipped policy's prior on perturbed surfaces (fixed seeds): a final choice no
    worse than AutoCCL-style coordinate descent's at less than half its exploration cost,
    every bucket within 3 % of the best; in the sidecar's setting (the policy's most
    probable configurations and pair probes, one plan per table round) the same, and a
    busy cell (128-call rounds) no worse than coordinate descent either."""
    spec = parse_topology(TOPOLOGIES["p5x2"])
    base = surface_arms(generate(Simulator(spec, noise=NoiseModel(stddev=0.04)), sizes=SIZES))
    decider = Decider.of(Policy.load(), spec)
    dyn: list[tuple[float, float]] = []
    cd: list[tuple[float, float]] = []
    side: list[tuple[float, float]] = []
    busy: list[tuple[float, float]] = []
    for seed in range(2):
        raw = peer_bench.run_peers(
            peer_bench.perturbed(base, seed),
            policy_prior(decider),
            nccl_pick(decider),
            budget=200,
            seed=seed,
            nranks=decider.ctx.system.ranks,
            nnodes=decider.ctx.system.nodes,
            estimate=nccl_estimate(decider),  # the sidecar's probes, gated as it gates them
        )
        dyn += raw[peer_bench.DYNAMICCL]
        cd += raw["coordinate descent"]
        side += raw[peer_bench.SIDECAR]
        busy += raw["DynamICCL, sidecar, 128-call rounds"]
    c = np.array(cd)
    for got in (dyn, side):
        d = np.array(got)
        assert d[:, 0].mean() <= c[:, 0].mean()
        assert d[:, 0].max() <= 0.03
        assert d[:, 1].mean() < 0.5 * c[:, 1].mean()
    assert np.array(busy)[:, 0].mean() <= c[:, 0].mean()


def test_candidate_set_keeps_a_slot_for_every_pair_beyond_max_candidates() -> None:
    """Ten (algo, proto) groups, two slots: every group's best-scored arm is a candidate
    (a group left out is never tried, and the prior may rank the best one low)."""
    groups = [g for g in range(10) for _ in range(2)]
    scores = [-float(i) for i in range(20)]
    idx, w = candidate_set(scores, default=None, max_candidates=2, groups=groups)
    assert {groups[i] for i in idx} == set(range(10))
    assert idx == [2 * g for g in range(10)]
    assert len(w) == 10


@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_a_default_far_slower_costs_no_more_than_coordinate_descent(factor: float) -> None:
    """Where NCCL's default (and the prior's first choice with it) runs 2x or 3x slower than
    the best configuration, another protocol of NCCL's algorithm (`peer_bench.default_wrong`,
    2-node EFA topology, perturbed, fixed seeds), the race's exploration cost over 200
    calls is no higher than AutoCCL-style coordinate descent's on the same buckets and
    draws: in the bench's setting and in the sidecar's at 16- and 128-call rounds. Before,
    the bench's and the 16-call rows paid more (16.6 and 16.3 % against 15.8 %): the race
    walked the channel ladder of NCCL's pair (every rung as slow, none out against a
    leader of that pair) before another pair got a look, and kept NCCL's pick until a look
    at twice its speed had `final_calls` calls. At 3x the first epoch's committed calls of
    NCCL's pick were more than coordinate descent's whole cost until an epoch ended at the
    first look measured far ahead (`BucketTuner.escape_due`; docs/benchmarks.md)."""
    spec = parse_topology(TOPOLOGIES["p5x2"])
    base = surface_arms(generate(Simulator(spec, noise=NoiseModel(stddev=0.04)), sizes=SIZES))
    decider = Decider.of(Policy.load(), spec)
    prior, pick = policy_prior(decider), nccl_pick(decider)
    got: dict[str, list[float]] = {}
    for seed in range(2):
        wrong, where = peer_bench.default_wrong(
            peer_bench.perturbed(base, seed), prior, pick, factor, seed
        )
        keys = sorted(wrong, key=lambda k: (k[0].nccl_id, k[1]))  # run_peers' order
        mine = [where.get(k) == "protocol" for k in keys]
        raw = peer_bench.run_peers(
            wrong, prior, pick, budget=200, seed=seed, nranks=decider.ctx.system.ranks,
            nnodes=decider.ctx.system.nodes, estimate=nccl_estimate(decider),
        )  # fmt: skip
        for k, v in raw.items():
            got.setdefault(k, []).extend(c for (_, c), m in zip(v, mine, strict=True) if m)
    assert len(got["coordinate descent"]) >= 20
    cd = float(np.mean(got["coordinate descent"]))
    for row in (peer_bench.DYNAMICCL, *peer_bench.SIDECAR_ROUNDS):
        assert np.mean(got[row]) <= cd, (row, np.mean(got[row]), cd)


def test_the_slowest_configuration_played_and_its_calls_account_for_the_cost() -> None:
    """A configuration 20x slower than NCCL's pick gets a look, and the report says how
    slow and how many calls: with only these two arms, those calls are the whole cost."""
    arms = [
        Arm(Algo.RING, Proto.SIMPLE, None, 10.0, 0.1),
        Arm(Algo.RING, Proto.LL, None, 200.0, 2.0),
    ]
    res = tune_bucket(
        Collective.ALLREDUCE, 1 << 20, arms, lambda _c, _n, a: [0.0] * len(a),
        lambda _c, _n, _a: 0, budget=64, seed=0, cfg=TunerConfig(), max_candidates=2,
        nranks=2, nnodes=1,
    )  # fmt: skip
    assert res.slowest_played == pytest.approx(20.0)
    assert 1 <= res.slowest_calls < res.calls
    assert res.exploration_cost == pytest.approx(res.slowest_calls * 19.0 / res.calls)
    assert (res.chosen.algo, res.chosen.proto) == (Algo.RING, Proto.SIMPLE)

"""The peers of `bench tune --peers` and the surfaces where the prior is wrong."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.eval import peer_bench as pb
from dynamiccl.policy.eval import peers
from dynamiccl.policy.eval.bench_tune import Arm, tune_bucket
from dynamiccl.policy.online.tuner import TunerConfig

PAIRS = ((Algo.RING, Proto.SIMPLE), (Algo.TREE, Proto.SIMPLE), (Algo.RING, Proto.LL128))
CHANNELS = (None, 1, 2, 4, 8, 16, 32)


def grid(pair_time: Sequence[float], best_channels: int = 16) -> list[Arm]:
    """Every pair with every channel count; time unimodal in the channels (NCCL's count
    = 10 % above the pair's best)."""
    out = []
    for (algo, proto), t in zip(PAIRS, pair_time, strict=True):
        for c in CHANNELS:
            f = 1.1 if c is None else 1.0 + 0.1 * abs(math.log2(c / best_channels))
            out.append(Arm(algo, proto, c, t * f, 0.04 * t * f))
    return out


def scores_for(arms: Sequence[Arm], ranking: Sequence[tuple[Algo, Proto]]) -> list[float]:
    """A prior that ranks pairs as given (NCCL's channel row first within a pair)."""
    return [
        -5.0 * ranking.index((a.algo, a.proto)) - (0.0 if a.nchannels is None else 3.0)
        for a in arms
    ]


def case(
    arms: list[Arm], scores: list[float], default: int | None = 0, seed: int = 0
) -> peers.Case:
    return peers.Case(Collective.ALLREDUCE, 1 << 20, arms, scores, default, seed)


def test_coordinate_descent_walks_from_nccls_pick_to_the_best() -> None:
    arms = grid([100.0, 80.0, 120.0])
    out = peers.coordinate_descent(case(arms, scores_for(arms, PAIRS)), 200)
    best = min(range(len(arms)), key=lambda i: arms[i].time_us)
    assert out.final == best  # tree/simple at 16 channels: two coordinates away
    assert len(out.played) == 200
    counts = {t: out.played.count(t) for t in set(out.played)}
    assert all(n >= peers.CD_CALLS for n in counts.values())  # a few calls per candidate


def test_fixed_strategies_pay_their_regret_on_every_call() -> None:
    arms = grid([100.0, 80.0, 120.0])
    c = case(arms, scores_for(arms, PAIRS))
    for strategy in (peers.PEERS["NCCL default"], peers.PEERS["static policy"]):
        regret, cost = peers.figures(c, strategy(c, 50))
        assert regret == pytest.approx(cost)
        assert regret > 0.3  # ring/simple at NCCL's count vs tree/simple at 16


def test_uniform_and_ucb_measure_every_configuration() -> None:
    arms = grid([100.0, 80.0, 120.0])
    c = case(arms, scores_for(arms, PAIRS))
    for name in ("uniform", "UCB (no prior)"):
        out = peers.PEERS[name](c, 200)
        assert {a.time_us for a in arms} <= set(out.played), name
        assert peers.figures(c, out)[0] <= 0.1


def test_every_strategy_draws_the_same_noise_as_the_tuner() -> None:
    arms = grid([100.0, 80.0, 120.0])
    c = case(arms, scores_for(arms, PAIRS), seed=7)
    mine = np.random.default_rng([7, Collective.ALLREDUCE.nccl_id, 1 << 20])
    assert c.rng().normal() == mine.normal()


def test_prior_wrong_surfaces() -> None:
    arms = grid([100.0, 80.0, 120.0])
    ranking = (PAIRS[1], PAIRS[0], PAIRS[2])  # the prior loves tree/simple
    buckets = {(Collective.ALLREDUCE, 1 << 20): arms}

    def prior(_c: Collective, _n: int, a: Sequence[Arm]) -> list[float]:
        return scores_for(a, ranking)

    fav = pb.prior_wrong(buckets, prior, "favourite", 0)[(Collective.ALLREDUCE, 1 << 20)]
    for a, b in zip(arms, fav, strict=True):
        assert b.time_us == pytest.approx(
            a.time_us * (1.25 if (a.algo, a.proto) == PAIRS[1] else 1)
        )
    hid = pb.prior_wrong(buckets, prior, "hidden", 0)[(Collective.ALLREDUCE, 1 << 20)]
    fastest = min(hid, key=lambda a: a.time_us)
    assert (fastest.algo, fastest.proto) == PAIRS[2]  # the one the prior ranks last
    assert fastest.time_us == pytest.approx(0.9 * min(a.time_us for a in arms))


@pytest.mark.parametrize("kind", ["favourite", "hidden"])
def test_the_tuner_finds_the_best_where_the_prior_is_wrong(kind: str) -> None:
    """The prior's favourite runs slower, or the best pair is the one it ranks last: the
    tuner still ends on the best configuration within 200 calls, on every seed."""
    ranking = (PAIRS[1], PAIRS[0], PAIRS[2])
    for seed in range(5):
        arms = grid([100.0, 90.0, 115.0])
        buckets = {(Collective.ALLREDUCE, 1 << 20): arms}

        def prior(_c: Collective, _n: int, a: Sequence[Arm]) -> list[float]:
            return scores_for(a, ranking)

        wrong = pb.prior_wrong(buckets, prior, kind, seed)[(Collective.ALLREDUCE, 1 << 20)]  # type: ignore[arg-type]
        best = min(wrong, key=lambda a: a.time_us)
        assert prior(Collective.ALLREDUCE, 1, wrong)[wrong.index(best)] < max(
            prior(Collective.ALLREDUCE, 1, wrong)
        )  # the prior does not rank it first
        res = tune_bucket(
            Collective.ALLREDUCE, 1 << 20, wrong, prior, lambda _c, _n, _a: 0,
            budget=200, seed=seed, cfg=TunerConfig(), max_candidates=8, nranks=8, nnodes=1,
        )  # fmt: skip
        assert res.regret <= 0.03, (kind, seed, res.chosen)


@pytest.mark.parametrize("factor", [1.5, 2.0, 3.0])
def test_default_wrong_surfaces(factor: float) -> None:
    """NCCL's pick runs `factor` x slower than the best, the best at the drawn distance:
    another channel count of NCCL's pair, another protocol, another algorithm; the rows
    that are neither slowed nor the target keep their times."""
    arms = grid([100.0, 110.0, 105.0])
    ranking = (PAIRS[0], PAIRS[2], PAIRS[1])  # NCCL's pair first, tree/simple third
    key = (Collective.ALLREDUCE, 1 << 20)

    def prior(_c: Collective, _n: int, a: Sequence[Arm]) -> list[float]:
        return scores_for(a, ranking)

    seen = set()
    for seed in range(12):
        wrong, where = pb.default_wrong({key: arms}, prior, lambda _c, _n, _a: 0, factor, seed)
        got, dist = wrong[key], where[key]
        seen.add(dist)
        best = min(got, key=lambda a: a.time_us)
        assert got[0].time_us == pytest.approx(factor * best.time_us)
        assert sum(a.time_us <= best.time_us * 1.0001 for a in got) == 1  # one best
        pair = (best.algo, best.proto)
        assert {
            "channels": pair == PAIRS[0] and best.nchannels is not None,
            "protocol": best.algo is Algo.RING and best.proto is not Proto.SIMPLE,
            "algorithm": best.algo is Algo.TREE,
        }[dist]
        moved = {(a.algo, a.proto) for a, b in zip(arms, got, strict=True) if a != b}
        assert moved <= {PAIRS[0], pair}
    assert seen == set(pb.DISTANCES)

"""The policy's online tuner on the sidecar: per-cell learning into a preferred table."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import EventKind
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    decide,
    scale_class,
)
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.sidecar.baseline import NcclDefaults
from dynamiccl.sidecar.tuning import Tuning

SC = scale_class(8, 1)
RING_LL128 = (1, 1, 0, 0)
RING_SIMPLE = (1, 2, 0, 0)
TREE_SIMPLE = (0, 2, 0, 0)
NVLS = (4, 2, 0, 0)


def base(
    choices: tuple[Choice, ...] = (Choice(algo=Algo.RING, proto=Proto.LL128),),
) -> DecisionTable:
    cell = Cell(
        collective=Collective.ALLREDUCE,
        bucket=20,
        scale=SC,
        choices=choices,
        candidates=(
            Candidate(algo=Algo.RING, proto=Proto.SIMPLE, weight=100),
            Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, weight=60),
        ),
        explore=0.25,
    )
    static = Cell(
        collective=Collective.ALLGATHER,
        bucket=20,
        scale=SC,
        choices=(Choice(algo=Algo.RING, proto=Proto.SIMPLE),),
    )
    return DecisionTable(
        version=1,
        scales=(SC,),
        cells=(cell, static),
        explore=ExploreSchedule(seed=9, half_life_log2=6),
    )


class FixedDefaults(NcclDefaults):
    """NCCL's pick: NVLS/SIMPLE for every cell (no features needed)."""

    def __init__(self) -> None:
        super().__init__(None)

    def _pick(self, coll: int, bucket: int, nranks: int, nnodes: int) -> tuple[int, int, float]:
        return 4, 2, 25.0


TIMES = {RING_LL128: 30.0, RING_SIMPLE: 24.0, TREE_SIMPLE: 36.0, NVLS: 27.0}


def run(t: Tuning, calls: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    arms = list(TIMES)
    for _ in range(calls):
        arm = rng.choice(arms)
        t.observe(SC, 4, 20, 8, 1, arm, TIMES[arm] * rng.lognormvariate(0, 0.03))


def test_the_fastest_arm_becomes_the_first_choice_and_exploration_ends() -> None:
    cfg = TunerConfig(epoch_calls=16, budget_calls=400)
    t = Tuning(base(), cfg, FixedDefaults())
    before = t.signature()
    run(t, 600)
    assert t.signature() != before
    (ct,) = t.cells.values()
    assert ct.arms == [RING_LL128, RING_SIMPLE, TREE_SIMPLE, NVLS]  # choices, candidates, NCCL
    assert ct.default_arm == 3
    table = t.table(version=2)
    assert table is not None
    again = DecisionTable.model_validate(table.model_dump(mode="json"))
    assert again.digest == table.digest
    cell = table.cell(Collective.ALLREDUCE, 20, SC)
    assert cell is not None
    assert cell.choices[0] == Choice(algo=Algo.RING, proto=Proto.SIMPLE)
    assert Choice(algo=Algo.RING, proto=Proto.LL128) in cell.choices  # the base's fallback kept
    assert cell.candidates == ()  # budget spent: exploitation only
    assert table.explore.half_life_log2 is None
    # the untuned static cell is the base's
    assert table.cell(Collective.ALLGATHER, 20, SC) == base().cell(Collective.ALLGATHER, 20, SC)
    pick = decide(table, Collective.ALLREDUCE, 1 << 20, 8, 1, 0, 12345, lambda _c: True)
    assert pick == Choice(algo=Algo.RING, proto=Proto.SIMPLE)
    kinds = [e.kind for e in t.take_events()]
    assert EventKind.EXPLORATION_DONE in kinds
    assert t.take_events() == []


def test_a_choice_slower_than_nccls_pick_is_reverted_by_the_guardrail() -> None:
    # an epoch long enough that the guardrail has its evidence at the first fold, before
    # the race has moved off the slow arm
    cfg = TunerConfig.model_validate(
        {"epoch_calls": 32, "guardrail": {"threshold": 0.02, "min_samples": 4}}
    )
    t = Tuning(base(), cfg, FixedDefaults())
    rng = random.Random(2)
    times = {RING_LL128: 60.0, RING_SIMPLE: 70.0, TREE_SIMPLE: 80.0, NVLS: 20.0}
    for _ in range(200):
        arm = rng.choice(list(times))
        t.observe(SC, 4, 20, 8, 1, arm, times[arm] * rng.lognormvariate(0, 0.02))
    table = t.table(version=5)
    assert table is not None
    cell = table.cell(Collective.ALLREDUCE, 20, SC)
    assert cell is not None
    assert cell.choices[0] == Choice(algo=Algo.NVLS, proto=Proto.SIMPLE)
    assert EventKind.GUARDRAIL_REVERT in [e.kind for e in t.take_events()]


def test_nccls_pick_as_committed_arm_of_a_cell_without_choices_means_no_forcing() -> None:
    cfg = TunerConfig(epoch_calls=16, budget_calls=200)
    t = Tuning(base(choices=()), cfg, FixedDefaults())
    rng = random.Random(4)
    times = {RING_SIMPLE: 40.0, TREE_SIMPLE: 45.0, NVLS: 20.0}
    for _ in range(400):
        arm = rng.choice(list(times))
        t.observe(SC, 4, 20, 8, 1, arm, times[arm] * rng.lognormvariate(0, 0.02))
    cell = t.table(version=2).cell(Collective.ALLREDUCE, 20, SC)  # type: ignore[union-attr]
    assert cell is not None
    assert cell.choices == ()


def test_untuned_cells_calls_of_no_arm_and_disabled_tuning_are_ignored() -> None:
    cfg = TunerConfig(epoch_calls=4)
    t = Tuning(base(), cfg, FixedDefaults())
    t.observe(SC, 2, 20, 8, 1, RING_SIMPLE, 10.0)  # all-gather cell has no candidates
    t.observe(SC, 4, 21, 8, 1, RING_SIMPLE, 10.0)  # no such cell
    assert t.cells == {}
    t.observe(SC, 4, 20, 8, 1, (6, 0, 0, 0), 10.0)  # PAT: no arm of the cell
    (ct,) = t.cells.values()
    assert ct.calls == 0
    t.observe(SC, 4, 20, 8, 1, (4, 2, 0, 0), 10.0)  # NCCL's own pick counts for the default arm
    assert ct.calls == 1
    off = Tuning(base(), cfg, FixedDefaults(), enabled=False)
    run(off, 50)
    assert off.cells == {}
    assert off.signature() == ()
    assert Tuning(None, cfg, FixedDefaults()).table(3) is None


# --- the channel variants: the race walks their ladders ----------------------------------
CID = (SC, 4, 20)


_CALLS = itertools.count()


def play(t: Tuning, time_of: Callable[[tuple[int, int, int, int]], float], calls: int) -> None:
    """Run `calls` calls as the plugin would: each takes the arm the cell's plan draws."""
    rng = random.Random(5)
    if CID not in t.cells:
        t.observe(SC, 4, 20, 8, 1, NVLS, time_of(NVLS))  # NCCL's own pick creates the cell
    for _ in range(calls):
        ct = t.cells[CID]
        arm = ct.arms[ct.tuner.arm_for_call(next(_CALLS))]  # the plugin's call counter
        t.observe(SC, 4, 20, 8, 1, arm, time_of(arm) * rng.lognormvariate(0, 0.03))


def ring_simple_at(best_channels: int) -> Callable[[tuple[int, int, int, int]], float]:
    """RING/SIMPLE is the best pair; its time is unimodal in the channel count, lowest at
    `best_channels` (17 % below its NCCL-default count), 10 % more per doubling away."""

    def time_of(arm: tuple[int, int, int, int]) -> float:
        if arm[:2] == RING_SIMPLE[:2] and arm[2]:
            return 20.0 * (1.0 + 0.1 * abs(math.log2(arm[2] / best_channels)))
        return TIMES.get(arm, 40.0)

    return time_of


def racing(channel_range: tuple[int, int] | None = (1, 64), *, refine: float = 0.5) -> Tuning:
    """The sidecar's tuning: one race over the table's arms and their channel ladders."""
    cfg = TunerConfig(epoch_calls=16, budget_calls=400, refine=refine)
    return Tuning(base(), cfg, FixedDefaults(), channel_range=channel_range)


def test_no_channel_variants_without_refine_or_channel_range() -> None:
    for t in (racing(None), racing(refine=0.0)):
        play(t, ring_simple_at(16), 820)
        (ct,) = t.cells.values()
        assert ct.arms == [RING_LL128, RING_SIMPLE, TREE_SIMPLE, NVLS]
        # the whole budget explores the table's arms
        assert ct.tuner.cfg.budget_calls == 400


def test_the_race_walks_the_channel_ladder_to_a_better_count_in_one_phase() -> None:
    t = racing()
    play(t, ring_simple_at(16), 400)
    (ct,) = t.cells.values()
    assert ct.tuner.cfg.budget_calls == 400  # one phase: the whole budget
    assert ct.arms[:4] == [RING_LL128, RING_SIMPLE, TREE_SIMPLE, NVLS]
    assert (1, 2, 16, 0) in ct.arms  # variants of every pair
    assert (1, 2, 1, 0) in ct.arms
    cell = t.table(version=3).cell(Collective.ALLREDUCE, 20, SC)  # type: ignore[union-attr]
    assert cell is not None
    assert cell.choices[0] == Choice(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=16)
    # never paid for a rung the walk did not reach: 1 and 2 channels are far down the ladder
    n = {a: s.n for a, s in zip(ct.arms, ct.tuner.stats, strict=True)}
    assert n[(1, 2, 1, 0)] == 0
    assert n[(1, 2, 2, 0)] == 0


def test_the_race_keeps_to_the_policys_channel_range() -> None:
    t = racing(channel_range=(2, 8))
    play(t, ring_simple_at(16), 400)
    (ct,) = t.cells.values()
    assert {a[2] for a in ct.arms} == {0, 2, 4, 8}


def test_the_sidecar_and_the_bench_share_one_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both build a cell's tuner with `online.cell_tuner`, and the same measurements give the
    same choices through the sidecar (`Tuning.observe`) and the bench's loop."""
    from dynamiccl.policy.eval import bench_tune  # noqa: PLC0415
    from dynamiccl.policy.online import tuner as online  # noqa: PLC0415
    from dynamiccl.sidecar import tuning as sidecar  # noqa: PLC0415

    assert getattr(sidecar, "cell_tuner") is online.cell_tuner  # noqa: B009
    assert getattr(bench_tune, "cell_tuner") is online.cell_tuner  # noqa: B009
    built: list[object] = []

    def spy(*args: Any, **kwargs: Any) -> online.BucketTuner:
        built.append(kwargs["key"])
        return online.cell_tuner(*args, **kwargs)

    monkeypatch.setattr(sidecar, "cell_tuner", spy)
    monkeypatch.setattr(bench_tune, "cell_tuner", spy)
    play(racing(), ring_simple_at(16), 1)  # the sidecar builds the cell's tuner
    arm = bench_tune.Arm(Algo.RING, Proto.SIMPLE, None, 10.0, 0.4)
    bench_tune.tune_bucket(
        Collective.ALLREDUCE, 1 << 20, [arm], lambda _c, _n, _a: [0.0],
        lambda _c, _n, _a: 0, budget=16, seed=0, cfg=TunerConfig(), max_candidates=1,
        nranks=8, nnodes=1,
    )  # fmt: skip
    monkeypatch.undo()
    assert len(built) == 2  # one cell each
    # the same scripted measurements through both paths
    t = racing()
    t.observe(SC, 4, 20, 8, 1, NVLS, ring_simple_at(16)(NVLS))  # NCCL's pick creates the cell
    ct = t.cells[CID]
    twin = online.cell_tuner(
        [(a[0], a[1]) for a in ct.arms], [a[2] for a in ct.arms],
        list(ct.tuner.prior_weights or []), ct.default_arm, cfg=ct.tuner.cfg, key=ct.tuner.key,
    )  # fmt: skip
    twin.observe(ct.default_arm or 0, ring_simple_at(16)(NVLS))
    rng = np.random.default_rng(4)
    time_of = ring_simple_at(16)
    for j in range(400):
        a_side = ct.tuner.arm_for_call(j)
        assert twin.arm_for_call(j) == a_side
        y = time_of(ct.arms[a_side]) * float(np.exp(rng.normal(0, 0.03)))
        t.observe(SC, 4, 20, 8, 1, ct.arms[a_side], y)
        twin.observe(a_side, y)
        if (j + 2) % 16 == 0:  # the sidecar's epoch ends after its 16th call of the cell
            twin.end_epoch()
        assert twin.plan == ct.tuner.plan
    assert twin.chosen() == ct.tuner.chosen()

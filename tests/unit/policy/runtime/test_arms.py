"""A canary job's table explores the promoted version's choice where the two differ (issue 29)."""

from __future__ import annotations

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import ClassCoverage
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import MAX_CANDIDATES, Candidate, Cell, Choice, DecisionTable
from dynamiccl.policy.runtime.arms import ARM_RATE, add_arms, nccl_picker
from dynamiccl.policy.runtime.compile import communicators
from dynamiccl.policy.sim.nccl_model import NcclModel
from tests.topology_samples import dgx_h100

RING_LL = Choice(algo=Algo.RING, proto=Proto.LL)
TREE_LL128 = Choice(algo=Algo.TREE, proto=Proto.LL128)
RING_SIMPLE = Choice(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=8)


def _cell(bucket: int, *choices: Choice, candidates: tuple[Candidate, ...] = (),
          explore: float = 0.0) -> Cell:  # fmt: skip
    return Cell(collective=Collective.ALLREDUCE, bucket=bucket, scale=11, choices=choices,
                candidates=candidates, explore=explore)  # fmt: skip


def _table(*cells: Cell) -> DecisionTable:
    return DecisionTable(version=1, scales=(11,), cells=cells)


def test_the_promoted_choice_is_explored_only_where_the_first_choices_differ() -> None:
    unmeasured = Candidate(algo=Algo.NVLS, proto=Proto.SIMPLE, weight=3)
    canary = _table(
        _cell(20, RING_LL, TREE_LL128),  # same first choice: nothing to compare
        _cell(25, TREE_LL128, RING_LL, candidates=(unmeasured,), explore=1 / 128),
        _cell(27, RING_SIMPLE),  # the promoted table leaves it to NCCL: no arm
    )
    promoted = _table(_cell(20, RING_LL), _cell(25, RING_LL, TREE_LL128))
    table, arms = add_arms(canary, promoted)
    assert [(a.size_bucket, a.choice.algo, a.baseline.algo) for a in arms] == [(25, "tree", "ring")]
    assert (arms[0].baseline.proto, arms[0].scale, arms[0].collective) == ("ll", 11, "allreduce")
    by_bucket = {c.bucket: c for c in table.cells}
    armed = by_bucket[25]
    assert armed.choices == (TREE_LL128, RING_LL)  # the canary's choices stand: it runs them
    first = armed.candidates[0]
    assert (first.algo, first.proto, first.weight) == (Algo.RING, Proto.LL, 3)  # half the weight
    assert armed.candidates[1] == unmeasured
    assert armed.explore == ARM_RATE
    assert by_bucket[20] == canary.cells[0]
    assert by_bucket[27] == canary.cells[2]


def test_a_full_candidate_list_makes_room_and_a_higher_rate_is_kept() -> None:
    full = tuple(Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, nchannels=n) for n in range(1, 5))
    assert len(full) == MAX_CANDIDATES
    canary = _table(_cell(25, TREE_LL128, candidates=full, explore=0.25))
    table, arms = add_arms(canary, _table(_cell(25, RING_LL)))
    (cell,) = table.cells
    assert len(cell.candidates) == MAX_CANDIDATES
    assert cell.candidates[0].algo is Algo.RING
    assert cell.candidates[0].weight == 3  # the three kept candidates' weight
    assert cell.explore == 0.25
    assert len(arms) == 1


def test_identical_tables_have_no_arms() -> None:
    t = _table(_cell(25, TREE_LL128))
    table, arms = add_arms(t, t)
    assert arms == []
    assert table == t


def _feats() -> StateFeatures:
    return StateFeatures.model_validate(
        {
            "world_size": 32, "gpus_per_pod": 8, "replicas": 4, "nproc_per_node": 8,
            "topology": {**dgx_h100("h100", 4), "tier_max": "same_rack",
                         "tier_mix": {"same_rack": 1.0, "same_node": 0.0}},
        }
    )  # fmt: skip


def test_where_the_promoted_version_leaves_a_cell_to_nccl_its_arm_is_nccls_own_pick() -> None:
    feats = _feats()
    world = communicators(feats)[0]
    pick = nccl_picker(feats)
    probe = Cell(collective=Collective.ALLREDUCE, bucket=25, scale=world.scale)
    nccl = pick(probe)
    assert nccl is not None
    model = NcclModel(world.context.system)
    a, p, _ = model.pick([list(Collective).index(Collective.ALLREDUCE)], [2.0**25.5])
    assert (nccl.algo, nccl.proto) == (list(Algo)[int(a[0])], list(Proto)[int(p[0])])
    assert (nccl.nchannels, nccl.chunk_bytes) == (0, 0)  # NCCL's channels and chunk
    other = next(
        c
        for c in (RING_LL, TREE_LL128, RING_SIMPLE)
        if (c.algo, c.proto) != (nccl.algo, nccl.proto)
    )
    canary = DecisionTable(version=1, scales=(world.scale,),
                           cells=(probe.model_copy(update={"choices": (other,)}),))  # fmt: skip
    promoted = DecisionTable(version=1, scales=(world.scale,), cells=(probe,))  # NCCL decides
    _, arms = add_arms(canary, promoted, pick)
    (arm,) = arms
    assert (arm.baseline.algo, arm.baseline.proto) == (nccl.algo.value, nccl.proto.value)
    assert add_arms(canary, promoted)[1] == []  # without a picker: no arm there
    assert pick(probe.model_copy(update={"scale": world.scale + 1})) is None  # no such shape


def test_nccls_pick_the_class_measured_comes_before_the_cost_models() -> None:
    """At 128 MiB all-reduce calls NCCL ran Ring/LL128 (measured as its own decision); the
    cost model at the bucket's middle (181 MiB) says otherwise: the arm is what NCCL ran."""
    feats = _feats()
    world = communicators(feats)[0]
    probe = Cell(collective=Collective.ALLREDUCE, bucket=27, scale=world.scale)
    model = nccl_picker(feats)(probe)
    assert model is not None
    ran = next(
        c
        for c in (RING_LL, TREE_LL128, RING_SIMPLE)
        if (c.algo, c.proto) != (model.algo, model.proto)
    )
    coverage = ClassCoverage.model_validate({
        "hardwareClass": "h100",
        "cells": [{
            "collective": "allreduce", "sizeBucket": 27, "nranks": feats.world_size,
            "nnodes": feats.topology.nodes,
            "measured": [
                {"algo": ran.algo.value, "proto": ran.proto.value, "calls": 900, "ncclOwn": True},
                {"algo": "nvls", "proto": "simple", "calls": 20},
                {"algo": "bogus", "proto": "ll", "calls": 5, "ncclOwn": True},
            ],
        }],
    })  # fmt: skip
    measured = nccl_picker(feats, coverage)(probe)
    assert measured == Choice(algo=ran.algo, proto=ran.proto)


def test_where_the_canary_leaves_a_cell_to_nccl_the_promoted_choice_is_its_arm() -> None:
    """The other way round: a retrained version dropped a choice the promoted one makes (seen:
    `dynamiccl demo --seed 3`, the 720 KiB all-gather's Ring/LL128 left to NCCL's Ring/LL,
    1.20x -> 1.00x). The canary job runs NCCL's own pick there and explores the promoted
    choice, so the judge compares the two inside the job; without NCCL's pick, no arm."""
    ring_ll128 = Choice(algo=Algo.RING, proto=Proto.LL128)
    confirm = Candidate(algo=Algo.RING, proto=Proto.LL128, weight=1)
    canary = _table(_cell(19, candidates=(confirm,), explore=1 / 256), _cell(20))
    promoted = _table(_cell(19, ring_ll128), _cell(20))  # 20: both leave it to NCCL

    def nccl(_cell: Cell) -> Choice:
        return RING_LL

    table, arms = add_arms(canary, promoted, nccl)
    (arm,) = arms
    assert (arm.size_bucket, arm.choice.proto, arm.baseline.proto) == (19, "ll", "ll128")
    armed = {c.bucket: c for c in table.cells}[19]
    assert armed.choices == ()  # the canary's decision stands: NCCL's
    assert (armed.candidates[0].algo, armed.candidates[0].proto) == (Algo.RING, Proto.LL128)
    assert armed.explore == ARM_RATE
    assert add_arms(canary, promoted)[1] == []  # no picker: NCCL's pick unknown, no arm

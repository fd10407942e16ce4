"""Compile-to-table: a valid plugin table, honouring modes, constraints and passthrough."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective
from dynamiccl.api.table import MAX_CANDIDATES, WEIGHT_MAX, DecisionTable, decide, scale_class
from dynamiccl.api.topology import load_topology, parse_topology
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.comparison import COMPARE_EXPLORE, compare_half_life
from dynamiccl.policy.runtime.compile import (
    BUCKETS,
    INITIAL_EXPLORE,
    MIN_EXPLORE,
    MODEL_MAX_LOCAL_RANKS,
    MODEL_MAX_NODES,
    communicators,
    compile_table,
    coverage,
    half_life_log2,
)
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.train.curriculum import Stage, sample_job
from dynamiccl.policy.train.inference import Policy, new_policy
from tests.topology_samples import dgx_h100

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
NODE: dict[str, Any] = dgx_h100("h100", 4)
POLICY = new_policy(0, hidden=16)
POLICY.net.eval()


def _features(**topo: Any) -> StateFeatures:
    return StateFeatures.model_validate(
        {
            "world_size": 32,
            "gpus_per_pod": 8,
            "replicas": 4,
            "nproc_per_node": 8,
            "topology": {
                **NODE,
                "tier_max": "same_rack",
                "tier_mix": {"same_rack": 1.0, "same_node": 0.0},
                **topo,
            },
            "workload": {"parallelism": "3d", "degrees": {"tp": 4, "pp": 2, "dp": 4}},
        }
    )


def test_scales_world_node_tp_dp_and_pp() -> None:
    """TP=4, PP=2, DP=4 on 4 nodes of 8, laid out TP, DP, PP (Megatron's tp-cp-ep-dp-pp)."""
    comms = communicators(_features())
    assert [c.scale for c in comms] == [
        scale_class(32, 4),
        scale_class(8, 1),
        scale_class(4, 1),  # TP=4
        scale_class(4, 2),  # DP=4, stride TP = 4: two ranks on each of 2 nodes
        scale_class(2, 2),  # PP=2, stride TP x DP = 16: one rank on each of 2 nodes
    ]
    assert comms[1].context.system.ranks == 8
    assert comms[2].context.system.ranks == 4
    assert (comms[3].context.system.ranks, comms[3].context.system.nodes) == (4, 2)
    assert (comms[4].context.system.ranks, comms[4].context.system.nodes) == (2, 2)


def _job(nodes: int, **degrees: int) -> StateFeatures:
    same_node = 8 * 7 / 2 * nodes / (8 * nodes * (8 * nodes - 1) / 2)
    return StateFeatures.model_validate(
        {
            "world_size": 8 * nodes,
            "gpus_per_pod": 8,
            "replicas": nodes,
            "nproc_per_node": 8,
            "topology": {
                **dgx_h100("h100", nodes),
                "tier_max": "same_rack",
                "tier_mix": {"same_node": same_node, "same_rack": 1 - same_node},
            },
            "workload": {"parallelism": "3d", "degrees": degrees},
        }
    )


def test_context_parallel_and_more_than_four_shapes_all_get_tables() -> None:
    """TP=4, CP=2, PP=4, DP=8 over 32 nodes of 8: seven scale classes, all compiled."""
    f = _job(32, tp=4, cp=2, pp=4, dp=8)
    assert coverage(f) == [
        ("world", 256, 32, scale_class(256, 32), True),
        ("tp", 4, 1, scale_class(4, 1), True),
        ("cp", 2, 1, scale_class(2, 1), True),  # stride TP = 4: both in one node
        ("dp", 8, 8, scale_class(8, 8), True),  # stride TP x CP = 8: one rank per node
        ("dp-cp", 16, 8, scale_class(16, 8), True),  # the gradient group: 2 per node
        ("pp", 4, 4, scale_class(4, 4), True),  # stride 64: one rank per node
    ]
    table = compile_table(POLICY, f)
    assert len(table.scales) == 7  # and the intra-node communicator (8 ranks, 1 node)
    assert set(table.scales) == {c[3] for c in coverage(f)} | {scale_class(8, 1)}
    assert {c.scale for c in table.cells} == set(table.scales)


def test_dp_is_the_rest_of_the_world_and_expert_groups_are_consecutive_dp_ranks() -> None:
    f = _job(4, tp=8, ep=4)  # DP left at 1: 32 / 8 = 4 data-parallel ranks
    assert coverage(f) == [
        ("world", 32, 4, scale_class(32, 4), True),
        ("tp", 8, 1, scale_class(8, 1), True),
        ("dp", 4, 4, scale_class(4, 4), True),
        ("ep", 4, 4, scale_class(4, 4), True),
    ]


def test_every_communicator_of_a_3d_job_gets_a_table() -> None:
    """TP=8, PP=4, DP=8 over 32 nodes of 8 GPUs: world, TP (inside a node), DP (8 ranks,
    one per node), PP (4 ranks, one per node)."""
    f = StateFeatures.model_validate(
        {
            "world_size": 256,
            "gpus_per_pod": 8,
            "replicas": 32,
            "nproc_per_node": 8,
            "topology": {
                **dgx_h100("h100", 32),
                "tier_max": "same_rack",
                "tier_mix": {"same_node": 896 / 32640, "same_rack": 1 - 896 / 32640},
            },
            "workload": {"parallelism": "3d", "degrees": {"tp": 8, "pp": 4, "dp": 8}},
        }
    )
    assert coverage(f) == [
        ("world", 256, 32, scale_class(256, 32), True),
        ("tp", 8, 1, scale_class(8, 1), True),
        ("dp", 8, 8, scale_class(8, 8), True),
        ("pp", 4, 4, scale_class(4, 4), True),
    ]
    table = compile_table(POLICY, f)
    assert set(table.scales) == {c[3] for c in coverage(f)}
    assert {c.scale for c in table.cells} == set(table.scales)


def test_learned_table_is_valid_and_explores() -> None:
    table = compile_table(POLICY, _features(), version=7)
    again = DecisionTable.model_validate(table.model_dump(mode="json"))  # full validation
    assert again.digest == table.digest
    assert table.version == 7
    assert table.explore.half_life_log2 == half_life_log2(200)
    assert table.cells
    for cell in table.cells:
        assert 1 <= len(cell.candidates) <= MAX_CANDIDATES
        assert cell.explore > 0
    # Once exploration has decayed, the plugin's decide() returns each world cell's
    # first choice (or NCCL's own, None, where the policy agrees with NCCL).
    world = [c for c in table.cells if c.scale == scale_class(32, 4)]
    assert world
    for cell in world:
        got = decide(table, cell.collective, 1 << cell.bucket, 32, 4, 1, 1 << 40, lambda _c: True)
        assert got == (cell.choices[0] if cell.choices else None)


def test_static_mode_compares_only_with_nccls_pick_and_respects_constraints() -> None:
    """A static table explores nothing but NCCL's own pick, the guardrail's comparison arm
    (NCCL's algorithm and protocol at NCCL's channels and chunk), decaying after the
    calls the guardrail's minSamples need; its choices keep the constraints."""
    spec = NCCLTuningPolicySpec.model_validate(
        {
            "mode": "static",
            "constraints": {"allowedAlgorithms": ["ring"]},
            "guardrails": {"minSamples": 50},
        }
    )
    table = compile_table(POLICY, parse_topology(NODE), spec)
    assert table.cells
    compared = 0
    for cell in table.cells:
        assert cell.choices
        assert all(c.algo is Algo.RING for c in cell.choices)
        if cell.candidates:
            (cand,) = cell.candidates
            assert (cand.nchannels, cand.chunk_bytes) == (0, 0)
            assert cell.explore == COMPARE_EXPLORE
            compared += 1
        else:  # the first choice is NCCL's own pick already: nothing to compare
            assert (cell.choices[0].nchannels, cell.choices[0].chunk_bytes) == (0, 0)
    assert compared
    h = table.explore.half_life_log2
    assert h == compare_half_life(50)
    assert h is not None
    assert COMPARE_EXPLORE * 2**h >= 50 > COMPARE_EXPLORE * 2 ** (h - 1)


def test_passthrough_and_observe_compile_to_no_cells() -> None:
    assert not compile_table(POLICY, _features(ina_active=True)).cells
    observe = NCCLTuningPolicySpec.model_validate({"mode": "observe"})
    assert not compile_table(POLICY, parse_topology(NODE), observe).cells


def test_every_collective_and_bucket_is_covered_when_the_policy_disagrees() -> None:
    table = compile_table(POLICY, parse_topology({**NODE, "nodes": 1}))
    colls = {c.collective for c in table.cells}
    assert colls == set(Collective)
    assert {c.bucket for c in table.cells} == set(BUCKETS)
    assert min(BUCKETS) == 3  # 8 B
    assert max(BUCKETS) >= 34  # 16 GiB


def test_half_life() -> None:
    assert half_life_log2(0) == 0
    h = half_life_log2(200)
    expected = 0.25 * 2 * (1 << h)  # sum of explore * 2**-(j >> h)
    assert 100 <= expected <= 400


def test_exploration_is_never_spent_on_nccls_own_pick_where_nccl_decides() -> None:
    # The shipped model on 2x AWS p5 leaves NCCL's pick in some cells (the EFA LL
    # departure) and keeps it in others.
    p5 = load_topology(EXAMPLES / "topology-aws-p5-2node.yaml")
    shipped = Policy.load()
    table = compile_table(shipped, p5, version=1)
    deciders = {c.scale: Decider(shipped, c.context) for c in communicators(p5)}
    decides, forces, checked = 0, 0, 0
    for cell in table.cells:
        mid = round(2 ** (cell.bucket + 0.5))  # where compile ranks the bucket
        pick = deciders[cell.scale].nccl_choice(cell.collective, mid).model_dump()
        own = [c for c in cell.candidates if c.model_dump(exclude={"weight"}) == pick]
        if cell.choices:
            forces += 1
            assert len(own) == 1  # leaving NCCL's pick keeps a way back to it
            assert cell.explore == INITIAL_EXPLORE
        else:
            decides += 1
            assert cell.candidates
            assert not own
            # explored as often as the policy thinks an alternative is better, never
            # not at all (the sidecar's tuner measures every cell it has)
            assert MIN_EXPLORE <= cell.explore <= INITIAL_EXPLORE
            # weights are relative to the more likely of NCCL's pick and the best
            # alternative (WEIGHT_MAX), and explore is INITIAL_EXPLORE x the alternatives'
            # share, both within their 1/8-octave steps (where weights clamped to 1 are a
            # small part of the sum); NCCL's pick weighs WEIGHT_MAX or less
            w = sum(c.weight for c in cell.candidates)
            share = w / (w + WEIGHT_MAX)
            top = max(c.weight for c in cell.candidates)
            if cell.explore > MIN_EXPLORE and top >= 256:
                err = math.log2(cell.explore / (INITIAL_EXPLORE * share))
                assert -0.25 <= err <= (0.25 if top < WEIGHT_MAX else 2.0)
                checked += 1
    assert decides
    assert forces
    assert checked


def _big_job(nodes: int) -> StateFeatures:
    """`nodes` DGX H100s, TP 8 x PP 4 x DP (the rest)."""
    return _job(nodes, tp=8, pp=4, dp=nodes // 4)


def test_the_model_s_training_range_is_the_curriculum_s() -> None:
    """MODEL_MAX_NODES / MODEL_MAX_LOCAL_RANKS hold for every job the curriculum trains on."""
    rng = np.random.default_rng(0)
    jobs = [sample_job(rng, stage) for stage in Stage for _ in range(300)]
    nodes = max(j.features.topology.nodes for j in jobs)
    local = max(j.features.nproc_per_node for j in jobs)
    assert nodes == MODEL_MAX_NODES  # the range is reached, and never passed
    assert local == MODEL_MAX_LOCAL_RANKS


def test_communicators_past_the_training_range_are_left_to_nccl_and_online_tuning() -> None:
    """A 1 024- or 12 000-node job: its world and DP groups (past 128 nodes, never seen in
    training) get no compiled cells, so the plugin runs NCCL's own choice and the sidecar tunes
    them online in their own scale classes; the groups within range (TP in a node, PP over 4
    nodes) are compiled. A 128-node job's world is compiled."""
    small = compile_table(POLICY, _big_job(128))
    assert scale_class(1024, 128) in small.scales
    for nodes in (1024, 12000):
        job = _big_job(nodes)
        table = compile_table(POLICY, job)
        assert scale_class(8 * nodes, nodes) not in table.scales  # world
        assert scale_class(nodes // 4, nodes // 4) not in table.scales  # DP: one rank a node
        assert set(table.scales) == {scale_class(8, 1), scale_class(4, 4)}
        assert {c.scale for c in table.cells} == set(table.scales)
        assert decide(table, Collective.ALLREDUCE, 1 << 28, 8 * nodes, nodes, 1, 0, _any) is None
        rows = {name: compiled for name, _, _, _, compiled in coverage(job)}
        assert rows == {"world": False, "tp": True, "dp": False, "pp": True}


def _any(_choice: object) -> bool:
    return True

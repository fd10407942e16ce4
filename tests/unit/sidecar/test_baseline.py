"""NCCL's own choice as the sidecar estimates and measures it."""

from __future__ import annotations

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.topology import TopologySpec
from dynamiccl.policy.runtime.compile import shape_spec
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.system import derive_spec, resolve
from dynamiccl.sidecar.baseline import Baseline, NcclDefaults
from tests.topology_samples import dgx_h100

NODE = dgx_h100()
FEATURES = StateFeatures.model_validate(
    {
        "world_size": 16,
        "gpus_per_pod": 8,
        "replicas": 2,
        "nproc_per_node": 8,
        "topology": {
            **NODE,
            "tier_max": "same_rack",
            "tier_mix": {"same_node": 0.0, "same_rack": 1.0},
        },
    }
)


def test_pick_is_the_nccl_model_for_the_world_and_for_one_node() -> None:
    d = NcclDefaults(FEATURES)
    spec = TopologySpec.model_validate(NODE)
    for (nranks, nnodes), system in (
        ((16, 2), resolve(spec)),
        ((8, 1), resolve(derive_spec(spec, nodes=1, container_gpus=8))),
        ((4, 1), resolve(derive_spec(spec, nodes=1, container_gpus=4))),
    ):
        model = NcclModel(system)
        for coll, bucket in ((4, 10), (4, 24), (2, 20), (0, 16)):
            a, p, t = model.pick([coll], [2.0 ** (bucket + 0.5)])
            assert d.pick(coll, bucket, nranks, nnodes) == (int(a[0]), int(p[0]), float(t[0]))
    assert d.pick(4, 20, 12, 3) is None  # a shape the job does not have
    assert NcclDefaults(None).pick(4, 20, 16, 2) is None


def test_measured_default_wins_over_the_estimate_then_the_fallback() -> None:
    b = Baseline(NcclDefaults(FEATURES))
    shape = (4, 20, 16, 2)
    est = b.defaults.pick(*shape)
    assert est is not None
    assert b.time_us(shape, fallback=1.0) == est[2]
    b.observe(shape, 10.0)
    b.observe(shape, 30.0)
    assert b.time_us(shape, fallback=1.0) == pytest.approx(20.0)
    assert Baseline(NcclDefaults(None)).time_us(shape, fallback=7.0) == 7.0
    again = Baseline(b.defaults)
    again.load_state(b.to_state())
    assert again.measured(shape) == pytest.approx(20.0)


def test_which_samples_measure_nccls_own_choice() -> None:
    b = Baseline(NcclDefaults(FEATURES))
    shape = (4, 20, 16, 2)
    pick = b.defaults.pick(*shape)
    assert pick is not None
    a, p, _ = pick
    assert b.is_default(shape, (5, 2, 0, 0), forced=False)  # not forced: NCCL decided
    assert b.is_default(shape, (a, p, 0, 0), forced=True)  # forced to exactly NCCL's pick
    assert not b.is_default(shape, (a, p, 4, 0), forced=True)  # but with other channels
    other = (a + 1) % 7
    assert not b.is_default(shape, (other, p, 0, 0), forced=True)


def test_pick_is_the_nccl_model_for_a_group_across_the_jobs_nodes() -> None:
    """A data-parallel group, one rank on each of the 2 nodes: the compiler's topology of it."""
    d = NcclDefaults(FEATURES)
    spec = TopologySpec.model_validate(NODE)
    model = NcclModel(resolve(shape_spec(spec, 2, 2)))
    for coll, bucket in ((4, 20), (2, 24)):
        a, p, t = model.pick([coll], [2.0 ** (bucket + 0.5)])
        assert d.pick(coll, bucket, 2, 2) == (int(a[0]), int(p[0]), float(t[0]))
    assert d.pick(4, 20, 4, 4) is None  # more nodes than the job has

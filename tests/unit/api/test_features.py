"""State features: consistent, frozen, strict, and a superset of the topology spec."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dynamiccl.api.features import (
    CclLibrary,
    Compression,
    StateFeatures,
    Tier,
    TierMix,
    TopologyFeatures,
    WorkloadFeatures,
    parse_parallelism,
)
from dynamiccl.api.topology import TopologySpec
from tests.topology_samples import dgx_h100


def topo(**over: Any) -> dict[str, Any]:
    base = dgx_h100("job", tier_max="same_rack", tier_mix={"same_node": 0.5, "same_rack": 0.5})
    return base | over


def features(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "world_size": 16,
        "gpus_per_pod": 8,
        "replicas": 2,
        "nproc_per_node": 8,
        "topology": topo(),
    }
    return base | over


def test_topology_block_is_a_valid_topology_spec() -> None:
    f = StateFeatures.model_validate(features())
    spec = f.topology.spec()
    assert isinstance(spec, TopologySpec)
    assert spec.world_size == 16
    # The whole block also validates as a spec (extra keys are allowed there).
    again = TopologySpec.model_validate(f.topology.model_dump(mode="json"))
    assert again.gpu == "H100"


def test_inconsistent_topology_is_rejected_naming_the_rule() -> None:
    with pytest.raises(ValidationError, match="nvls: true needs intra: nvswitch"):
        TopologyFeatures.model_validate(topo(intra="pcie", nvlink_GBps=0))


def test_tier_mix_must_sum_to_one() -> None:
    with pytest.raises(ValidationError, match="sum to 1"):
        TierMix(same_node=0.5, same_rack=0.4)


def test_tier_mix_beyond_tier_max_is_rejected() -> None:
    with pytest.raises(ValidationError, match="beyond tier_max"):
        TopologyFeatures.model_validate(
            topo(tier_max="same_rack", tier_mix={"same_node": 0.5, "cross_zone": 0.5})
        )


def test_world_size_must_match_replicas_times_nproc() -> None:
    with pytest.raises(ValidationError, match="world_size 15"):
        StateFeatures.model_validate(features(world_size=15))


def test_extra_fields_are_forbidden_and_models_frozen() -> None:
    with pytest.raises(ValidationError, match="extra"):
        StateFeatures.model_validate(features(color="red"))
    f = StateFeatures.model_validate(features())
    with pytest.raises(ValidationError):
        f.world_size = 3  # type: ignore[misc]


def test_tier_levels_are_ordered() -> None:
    assert [t.level for t in Tier] == [0, 1, 2, 3]


def test_passthrough_gates() -> None:
    assert not TopologyFeatures.model_validate(topo()).passthrough
    assert TopologyFeatures.model_validate(topo(ina_active=True)).passthrough
    assert TopologyFeatures.model_validate(topo(ccl_library=CclLibrary.GLOO)).passthrough


def test_compression_scales_effective_message_size() -> None:
    w = WorkloadFeatures(compression=Compression.FP16, compression_ratio=0.5)
    assert w.effective_message_scale == 0.5
    with pytest.raises(ValidationError):
        WorkloadFeatures(compression_ratio=0.0)


def test_json_round_trip() -> None:
    f = StateFeatures.model_validate(features())
    assert StateFeatures.model_validate_json(f.model_dump_json()) == f


def test_parallelism_annotation_grammar() -> None:
    mode, d = parse_parallelism(" 3D : TP=4, cp=2 ,pp=4,dp=8 ")
    assert mode.value == "3d"
    assert (d.tp, d.cp, d.pp, d.dp, d.ep, d.product) == (4, 2, 4, 8, 1, 256)
    assert parse_parallelism("fsdp")[1].product == 1
    for bad, needle in (
        ("zero", "expected one of"),
        ("3d:tp", "DIM=N"),
        ("3d:xx=2", "DIM=N with DIM in dp, tp, pp, ep, cp"),
        ("3d:tp=2,tp=4", "twice"),
        ("3d:tp=-1", "positive integer"),
        ("3d:cp=0", "out of range"),
        ("3d:cp=2048", "out of range"),
    ):
        with pytest.raises(ValueError, match=needle):
            parse_parallelism(bad)

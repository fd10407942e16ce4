"""NodeTopology -> topology spec."""

from __future__ import annotations

from typing import Any

import yaml

from dynamiccl.api.topology import TopologySpec, load_topology
from dynamiccl.node_agent import spec
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot


def test_spec_round_trips_through_the_contract_loader(fixture_root: Any, tmp_path: Any) -> None:
    topo = discover(HostRoot(fixture_root("gb200-nvl72-tray"))).topology
    assert isinstance(topo.spec, TopologySpec)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo.spec.model_dump(mode="json")))
    assert load_topology(path) == topo.spec


def test_mixed_models_are_not_averaged(fixture_root: Any) -> None:
    topo = discover(HostRoot(fixture_root("dgx-h100"))).topology
    mixed = topo.model_copy(
        update={"gpus": [topo.gpus[0].model_copy(update={"model": "H200"}), *topo.gpus[1:]]}
    )
    conds = Conditions()
    got, unknown = spec.build(mixed, conds)
    assert got is None
    assert unknown == ["gpu"]
    assert conds.items()[0].reason == "MixedModels"


def test_inconsistent_facts_are_reported_not_raised(fixture_root: Any) -> None:
    topo = discover(HostRoot(fixture_root("pcie-l40s"))).topology
    bad = topo.model_copy(update={"sharp": topo.sharp.model_copy(update={"capable": True})})
    conds = Conditions()
    got, unknown = spec.build(bad, conds)
    assert got is None
    assert unknown == ["(spec)"]
    assert "sharp" in conds.items()[0].message

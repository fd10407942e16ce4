"""NCCL's constants keep the shapes and values of src/graph/tuning.cc."""

from __future__ import annotations

from dynamiccl.api.nccl import NUM_ALGORITHMS, NUM_PROTOCOLS
from dynamiccl.policy.sim import nccl_tables as t


def test_shapes_follow_nccl_indexing() -> None:
    assert t.BASE_LAT.shape == (NUM_ALGORITHMS, NUM_PROTOCOLS)
    assert t.HW_LAT.shape == (3, NUM_ALGORITHMS, NUM_PROTOCOLS)
    assert t.LL_MAX_BW.shape == (4, 3)
    assert t.TREE_CORRECTION.shape == (NUM_PROTOCOLS, 24)


def test_spot_values() -> None:
    assert t.BASE_LAT[1].tolist() == [6.6, 14.0, 8.4]  # Ring LL / LL128 / Simple
    assert t.HW_LAT[t.HW_NVLINK, 4, 2] == 25.0  # NVLS over NVLink
    assert t.HW_LAT[t.HW_NET, 5, 2] == 20.9  # NVLSTree over the network
    assert t.LL_MAX_BW[2, 0] == 141.0  # Hopper, one node
    assert t.NVLS_EFFICIENCY[2] == 0.85
    assert t.TREE_CORRECTION[0, 12] == 0.4

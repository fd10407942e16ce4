"""Which env knobs can matter on a hardware class, and on one job."""

from __future__ import annotations

from typing import Any

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.policy.online import knob_scope
from tests.topology_samples import dgx_h100, h100_job

K = KnobName
ALL = list(KnobName)


def _features(nodes: int = 2, **topology: Any) -> StateFeatures:
    job = h100_job(nodes) | {"topology": dgx_h100("c", nodes, **topology)}
    return StateFeatures.model_validate(job)


@pytest.mark.parametrize(
    ("topology", "skipped"),
    [
        ({"fabric": "infiniband"}, {K.NCCL_SOCKET_NTHREADS, K.NCCL_NSOCKS_PERTHREAD}),
        ({"fabric": "roce"}, {K.NCCL_SOCKET_NTHREADS, K.NCCL_NSOCKS_PERTHREAD}),
        ({"fabric": "ethernet"}, {K.NCCL_IB_QPS_PER_CONNECTION, K.NCCL_IB_SPLIT_DATA_ON_QPS}),
        (  # EFA: AWS's net plugin, neither of NCCL's own transports
            {"fabric": "efa"},
            knob_scope.IB_KNOBS | knob_scope.SOCKET_KNOBS,
        ),
        (  # one NIC: NCCL_CROSS_NIC has nothing to choose between
            {"fabric": "ethernet", "nics_per_node": 1},
            {K.NCCL_IB_QPS_PER_CONNECTION, K.NCCL_IB_SPLIT_DATA_ON_QPS, K.NCCL_CROSS_NIC},
        ),
        (  # single-node boxes without a NIC (the class, whatever the job's node count)
            {"fabric": "none", "nics_per_node": 0, "nic_Gbps": 0, "nodes": 1},
            knob_scope.NETWORK_KNOBS,
        ),
    ],
)
def test_a_class_skips_the_knobs_its_fabric_cannot_use(
    topology: dict[str, Any], skipped: set[KnobName]
) -> None:
    shape = dict(topology)
    nodes = shape.pop("nodes", 2)
    got = knob_scope.class_skips(ALL, _features(nodes, **shape).topology)
    assert set(got) == skipped
    assert K.NCCL_NTHREADS not in got  # never a network knob
    assert all(reason for reason in got.values())


def test_reasons_name_the_transport_and_the_class() -> None:
    got = knob_scope.class_skips(ALL, _features(fabric="ethernet").topology)
    assert got[K.NCCL_IB_QPS_PER_CONNECTION] == (
        "NCCL's IB verbs transport's (infiniband, roce); this class's fabric is ethernet"
    )
    text = knob_scope.skip_text(got)
    assert text == (
        "not tried: NCCL_IB_QPS_PER_CONNECTION, NCCL_IB_SPLIT_DATA_ON_QPS (NCCL's IB verbs "
        "transport's (infiniband, roce); this class's fabric is ethernet)"
    )
    assert knob_scope.skip_text({}) == ""


def test_only_declared_knobs_are_reported() -> None:
    got = knob_scope.class_skips([K.NCCL_NTHREADS], _features(fabric="ethernet").topology)
    assert got == {}


def test_a_job_on_one_node_tries_no_network_value() -> None:
    one = _features(nodes=1)
    got = knob_scope.job_skips(ALL, one)
    assert set(got) == knob_scope.NETWORK_KNOBS
    assert got[K.NCCL_IB_QPS_PER_CONNECTION] == "a network knob; the job runs on one node"
    # the class's own reason stands where it has one
    assert "socket transport" in got[K.NCCL_SOCKET_NTHREADS]
    assert knob_scope.job_skips(ALL, _features(nodes=2)) == knob_scope.class_skips(
        ALL, _features(nodes=2).topology
    )

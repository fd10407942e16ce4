"""hack/gpu_layout.py: one GPU -> N ranks on device 0, each its own NCCL host; many -> one each."""

from __future__ import annotations

import pytest

from dynamiccl.testing import scripts

gpu_layout = scripts.load("gpu_layout")


@pytest.mark.parametrize("n", [2, 4])
def test_one_gpu_every_rank_is_its_own_node_over_loopback_sockets(n: int) -> None:
    procs = gpu_layout.layout(1, n, 29500, debug_file="/x/nccl.rank{rank}.log")
    assert [p.rank for p in procs] == list(range(n))
    assert {p.device for p in procs} == {0}
    assert len({p.env["NCCL_HOSTID"] for p in procs}) == n  # no two ranks share a host hash
    assert gpu_layout.nodes(procs) == n
    for p in procs:
        assert p.env["NCCL_NET"] == "Socket"
        assert p.env["NCCL_SOCKET_IFNAME"] == "lo"
        assert p.env["NCCL_IB_DISABLE"] == "1"
        assert p.env["NCCL_DEBUG"] == "INFO"
        assert p.env["RANK"] == str(p.rank)
        assert p.env["WORLD_SIZE"] == str(n)
        assert p.env["MASTER_PORT"] == "29500"
        assert p.env[gpu_layout.DEVICE_ENV] == "0"
        assert p.env["NCCL_DEBUG_FILE"] == f"/x/nccl.rank{p.rank}.log"


def test_several_gpus_one_process_each_with_nccls_own_transports() -> None:
    procs = gpu_layout.layout(8, 4, 1234)
    assert [p.device for p in procs] == [0, 1, 2, 3]
    assert [p.env[gpu_layout.DEVICE_ENV] for p in procs] == ["0", "1", "2", "3"]
    assert gpu_layout.nodes(procs) == 1
    for p in procs:
        assert "NCCL_HOSTID" not in p.env
        assert "NCCL_NET" not in p.env
        assert "NCCL_DEBUG_FILE" not in p.env
        assert p.env["LOCAL_RANK"] == str(p.rank)


def test_without_debug_no_nccl_logging() -> None:
    procs = gpu_layout.layout(1, 2, 1, debug_file="/x/{rank}", debug=False)
    assert all("NCCL_DEBUG" not in p.env and "NCCL_DEBUG_FILE" not in p.env for p in procs)
    assert all(p.env["NCCL_NET"] == "Socket" for p in procs)


@pytest.mark.parametrize(
    ("gpus", "n", "why"), [(1, 1, "one rank"), (0, 2, "no GPU"), (3, 4, "4 ranks on 3")]
)
def test_impossible_layouts_are_refused(gpus: int, n: int, why: str) -> None:
    with pytest.raises(gpu_layout.LayoutError, match=why):
        gpu_layout.layout(gpus, n, 1)

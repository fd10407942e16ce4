"""Where the GPU tier's rank processes run, and the NCCL environment each one gets.

With several GPUs: one process per GPU (rank r on device r), NCCL's own transports.
With one GPU: N rank processes on device 0. NCCL refuses two ranks on one device only when
they also share a host hash ("Duplicate GPU detected", checked between ranks of equal
`hostHash` when a communicator is set up); `NCCL_HOSTID` sets the string that hash is made
of. So each rank gets its own `NCCL_HOSTID`: each is a node of its own, one GPU per node,
and NCCL connects them through its network transport, here sockets over loopback
(`NCCL_NET=Socket`, `NCCL_SOCKET_IFNAME=lo`, `NCCL_IB_DISABLE=1`). Real NCCL runs: its
algorithm and protocol selection, kernels, tuner and profiler calls, timings.

Pure: no process is started here (hack/gpu_test.py and hack/gpu_ddp.py start them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SOCKET_ENV = {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}
DEBUG_SUBSYS = "INIT,ENV,TUNING,NET"  # plugin loads, versions, TUNING lines, the transport
DEVICE_ENV = "DYNAMICCL_GPU_DEVICE"  # the CUDA device a rank process opens


class LayoutError(ValueError):
    """The ranks cannot be laid out on these GPUs (the message says why)."""


@dataclass(frozen=True)
class RankProc:
    """One rank process: its rank, the device it opens and its environment additions."""

    rank: int
    device: int
    env: Mapping[str, str]


def layout(
    gpus: int, nranks: int, master_port: int, *, debug_file: str = "", debug: bool = True
) -> list[RankProc]:
    """The rank processes of one communicator of `nranks` on a machine with `gpus` GPUs.

    `gpus == 1`: every rank on device 0 with its own NCCL_HOSTID, over sockets on loopback.
    `gpus >= nranks`: rank r on device r, NCCL's own transports (no NCCL_HOSTID).
    `debug_file`: NCCL_DEBUG_FILE pattern, `{rank}` replaced per rank (every rank logs to its
    own file: on one GPU every log line says `[0]`, the device, so the file tells ranks apart).
    """
    if nranks < 2:
        raise LayoutError(f"{nranks} rank(s): a communicator of one rank runs no NCCL algorithm")
    if gpus < 1:
        raise LayoutError("no GPU")
    if 1 < gpus < nranks:
        raise LayoutError(f"{nranks} ranks on {gpus} GPUs: use 1 GPU or at least {nranks}")
    shared = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(nranks),
    }
    if debug:
        shared |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS}
    if gpus == 1:
        shared |= SOCKET_ENV
    out = []
    for r in range(nranks):
        device = 0 if gpus == 1 else r
        env = dict(shared) | {"RANK": str(r), "LOCAL_RANK": "0" if gpus == 1 else str(r)}
        env[DEVICE_ENV] = str(device)
        if gpus == 1:
            env["NCCL_HOSTID"] = f"dynamiccl-gpu-rank{r}"
        if debug and debug_file:
            env["NCCL_DEBUG_FILE"] = debug_file.replace("{rank}", str(r))
        out.append(RankProc(r, device, env))
    return out


def nodes(procs: list[RankProc]) -> int:
    """How many nodes NCCL will see: distinct NCCL_HOSTIDs (none set: one machine)."""
    ids = {p.env.get("NCCL_HOSTID", "") for p in procs}
    return len(ids) if "" not in ids else 1

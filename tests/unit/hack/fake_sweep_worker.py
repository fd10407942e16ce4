"""The one stand-in of the sweep's CPU test: plays one rank of NCCL against the real plugin.

Replaces hack/gpu_sweep_worker.py (torch + NCCL on a GPU). It follows the same spec in the same
call order (the small all-reduces up to each segment's start, then warm-up + timed calls per
point), and for every call does what NCCL does with the plugin
(dynamiccl/testing/nccl_player.py): the tuner's
getCollInfo on an NCCL-shaped cost table (PAT available: one rank per node), NCCL's resulting
choice, one profiler collective with GPU timestamps. It writes the INFO lines NCCL writes, in
NCCL 2.30.7's formats (the lines of tests/fixtures/nccl/built-2.30.7-rank0.log; not recorded
from a GPU): version, plugin loads, the comm line with nNodes = nRanks, the network, and on
rank 0 a TUNING line per call with the channel range NCCL would use (the plugin's count, else 2).
Times come from a fixed model in which ring/SIMPLE with 1 channel is fastest from 1 MiB on,
which NCCL's cost table does not pick: the sweep must report those cells.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from dynamiccl.sidecar.ctypes_abi import ALGO_NAMES, PROTO_NAMES
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, realistic_cost_table

COLL = {
    "allreduce": (4, "AllReduce"),
    "allgather": (2, "AllGather"),
    "reducescatter": (3, "ReduceScatter"),
}
DEFAULT_CHANNELS = 2


def model_us(coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
    """A fixed time model (us): ring/SIMPLE/1 channel is best at 1 MiB and above."""
    base = 10.0 + nbytes / 10_000.0 * (1.0, 1.3, 1.1)[proto]
    if nbytes >= 1 << 20 and (algo, proto, nch) == (1, 2, 1):
        return base * 0.5
    return base * (1.0 + 0.1 * algo)


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nnodes = world if os.environ.get("NCCL_HOSTID") else 1
    pre = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO "
    log = [pre + "NCCL version 2.30.7+cuda13.0\n", pre + "Using network Socket\n"]
    plugin = Plugin(Path(os.environ["NCCL_TUNER_PLUGIN"]))
    prof = ProfiledComm(plugin, 6, world, nnodes, comm_id=77, rank=rank)
    log.append(pre + "PROFILER/Plugin: Loaded dynamiccl (v6)\n")
    comm = Comm(plugin, 6, world, nnodes, comm_id=77)
    log.append(pre + "TUNER/Plugin: Using dynamiccl (v6)\n")
    log.append(
        f"{pre}comm 0x1 rank {rank} nRanks {world} nNodes {nnodes} localRanks 1 "
        "localRank 0 MNNVL 0\n"
    )
    calls = 0

    def call(coll: str, total: int, count_bytes: int) -> float:
        nonlocal calls
        cid, func = COLL[coll]
        cost = realistic_cost_table(cid, total, world, nnodes, pat=True)
        info = comm.get_coll_info(cid, total, cost)
        nch = info.nchannels or DEFAULT_CHANNELS
        if rank == 0:
            log.append(
                f"{pre}{func}: {count_bytes} Bytes -> Algo {ALGO_NAMES[info.algo]} proto "
                f"{PROTO_NAMES[info.proto]} channel{{Lo..Hi}}={{0..{nch - 1}}}\n"
            )
        t = model_us(cid, total, info.algo, info.proto, nch) + rank
        prof.collective(cid, count_bytes // 4, b"ncclFloat32", info.algo, info.proto, nch, t)
        calls += 1
        return t

    points: list[dict[str, object]] = []
    stall = int(os.environ.get("FAKE_STALL_AFTER", "-1"))  # segments, then wait (a deadline test)

    def write(complete: bool) -> None:
        out = {"rank": rank, "calls": calls, "points": points, "complete": complete}
        Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(out))
        Path(os.environ["NCCL_DEBUG_FILE"]).write_text("".join(log))

    for i, seg in enumerate(spec["segments"]):
        if i == stall:
            time.sleep(600)
        while calls < int(seg["start"]):
            call("allreduce", 4, 4)
        for coll in seg["collectives"]:
            for nbytes in seg.get("sizes", spec["sizes"]):
                per_rank = max(1, nbytes // 4 // (world if coll != "allreduce" else 1))
                total = per_rank * 4 * (world if coll != "allreduce" else 1)
                n = int(spec["warmup"]) + int(spec["iters"][str(nbytes)])
                times = [call(coll, total, per_rank * 4) for _ in range(n)][int(spec["warmup"]) :]
                points.append(
                    {"segment": seg["label"], "collective": coll, "nbytes": total,
                     "count_bytes": per_rank * 4, "times_us": times}
                )  # fmt: skip
        write(False)
    call("allreduce", 4, 4)  # the barrier
    log += [pre + text + "\n" for _, text in plugin.logs]
    comm.finalize()
    prof.finalize()
    write(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

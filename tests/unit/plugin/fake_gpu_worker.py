"""A CUDA-free stand-in for hack/gpu_worker.py: plays NCCL >= 2.28 against the real plugin.

Loads the .so named by NCCL_TUNER_PLUGIN through the ctypes harness, inits the profiler and then
the tuner of one communicator (NCCL's order), writes the INFO lines NCCL would (plugin loaded, the
plugin's own lines through the logger, rank 0's TUNING line per collective with the pair NCCL picks
after the plugin's getCollInfo) into NCCL_DEBUG_FILE, pushes a profiler record per collective, and
writes the rank's JSON like the real worker, with times from a fixed model.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from dynamiccl.sidecar.ctypes_abi import ALGO_NAMES, PROTO_NAMES
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, realistic_cost_table

COLL = {
    "allreduce": (4, "AllReduce"),
    "allgather": (2, "AllGather"),
    "reducescatter": (3, "ReduceScatter"),
}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log_path = os.environ["NCCL_DEBUG_FILE"].replace("%h", socket.gethostname())
    log: list[str] = []
    prefix = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [{rank}] NCCL INFO "
    plugin = Plugin(Path(os.environ["NCCL_TUNER_PLUGIN"]))
    prof = ProfiledComm(plugin, 6, world, 1, comm_id=77, rank=rank)
    log.append(prefix + "PROFILER/Plugin: Loaded dynamiccl (v6)\n")
    comm = Comm(plugin, 6, world, 1, comm_id=77)
    log.append(prefix + "TUNER/Plugin: Using dynamiccl (v6)\n")
    for _ in range(2 * int(spec["interval"])):
        comm.get_coll_info(4, 4, realistic_cost_table(4, 4, world, 1, nvls=True))
    out = []
    for coll in spec["collectives"]:
        cid, func = COLL[coll]
        for nbytes in spec["sizes"]:
            per_rank = max(1, nbytes // 4 // (world if coll != "allreduce" else 1))
            total = per_rank * 4 * (world if coll != "allreduce" else 1)
            times = []
            for _ in range(int(spec["iters"])):
                info = comm.get_coll_info(
                    cid, total, realistic_cost_table(cid, total, world, 1, nvls=True)
                )
                if rank == 0:
                    log.append(
                        f"{prefix}{func}: {per_rank * 4} Bytes -> Algo {ALGO_NAMES[info.algo]} "
                        f"proto {PROTO_NAMES[info.proto]} channel{{Lo..Hi}}={{0..1}}\n"
                    )
                t = 5.0 + total / 20_000.0 + rank
                prof.collective(cid, per_rank, b"ncclFloat32", info.algo, info.proto, 2, t)
                times.append(t)
            out.append(
                {
                    "collective": coll,
                    "nbytes": total,
                    "count_bytes": per_rank * 4,
                    "times_us": times,
                }
            )
    for _, text in plugin.logs:
        log.append(prefix + text + "\n")
    Path(log_path.replace("%p", str(os.getpid()))).write_text("".join(log))
    comm.finalize()
    prof.finalize()
    Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of `make gpu-test` (hack/gpu_test.py starts one process per GPU); its timing
helpers serve hack/gpu_sweep_worker.py too.

Joins a torch.distributed NCCL process group over every GPU, runs 2 x L small all-reduces (NCCL's
own choice until the plugin's call L, the forcing table from then on), then times each collective
of the sweep with CUDA events and writes the per-iteration times as JSON.

usage: python hack/gpu_worker.py SPEC.json   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_layout import DEVICE_ENV  # one GPU: every rank on device 0

WARMUP = 5


def make_op(coll: str, nbytes: int, world: int, dev: Any) -> tuple[Callable[[], None], int, int]:
    """The collective of one sweep point: (op, tuner nbytes, count x size bytes)."""
    import torch  # noqa: PLC0415 -- the GPU tier is the only user of CUDA torch
    import torch.distributed as dist  # noqa: PLC0415

    per_rank = max(1, nbytes // 4 // (world if coll != "allreduce" else 1))
    big = torch.ones(per_rank * world, device=dev)
    small = torch.ones(per_rank, device=dev)

    def op() -> None:
        if coll == "allreduce":
            dist.all_reduce(small)
        elif coll == "allgather":
            dist.all_gather_into_tensor(big, small)
        else:
            dist.reduce_scatter_tensor(small, big)

    total = per_rank * 4 * (world if coll != "allreduce" else 1)
    return op, total, per_rank * 4  # the tuner's nBytes: nRanks x count for AG / RS


def time_op(op: Callable[[], None], warmup: int, iters: int) -> list[float]:
    """Per timed iteration the op's GPU time in us (CUDA events), after `warmup` untimed calls."""
    import torch  # noqa: PLC0415

    times = []
    for i in range(warmup + iters):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        stop = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        op()
        stop.record()
        stop.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop) * 1000.0)  # ms -> us
    return times


def init(rank: int, world: int) -> Any:
    """Join the NCCL process group on this rank's device (DYNAMICCL_GPU_DEVICE, else the rank)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dev = torch.device("cuda", int(os.environ.get(DEVICE_ENV, rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    return dev


def _run(spec: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dev = init(rank, world)
    one = torch.ones(1, device=dev)
    for _ in range(2 * int(spec["interval"])):  # past the table's boundary; 4 bytes: not swept
        dist.all_reduce(one)
    torch.cuda.synchronize()
    out = []
    for coll in spec["collectives"]:
        for nbytes in spec["sizes"]:
            op, total, count_bytes = make_op(coll, nbytes, world, dev)
            times = time_op(op, WARMUP, int(spec["iters"]))
            out.append(
                {
                    "collective": coll,
                    "nbytes": total,
                    "count_bytes": count_bytes,  # what NCCL's TUNING line prints
                    "times_us": times,
                }
            )
    dist.barrier()
    dist.destroy_process_group()
    return out


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = _run(spec, rank, world)
    Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

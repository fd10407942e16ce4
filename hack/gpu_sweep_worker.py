"""One rank of the sweep (hack/gpu_sweep.py): every configuration in one process, by epochs.

Joins the NCCL process group once, then for each segment of the plan: small all-reduces until
its own call count reaches the segment's start (the plugin's table for that segment is in
effect from its epoch boundary on, a margin before), then times every (collective, size) of
the segment with CUDA events. Segment 0 has no table: NCCL's own choice. Writes the points in
call order as JSON, with the number of calls this process made, after every segment (a run
stopped at its deadline keeps the segments it finished).

usage: python hack/gpu_sweep_worker.py SPEC.json   (RANK, WORLD_SIZE, MASTER_ADDR/PORT set)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gpu_worker import init, make_op, time_op


def _write(spec: dict[str, Any], result: dict[str, Any]) -> None:
    path = Path(spec["out_dir"], f"rank{result['rank']}.json")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def _run(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415 -- the GPU tier is the only user of CUDA torch
    import torch.distributed as dist  # noqa: PLC0415

    dev = init(rank, world)
    one = torch.ones(1, device=dev)
    calls = 0
    points = []
    for seg in spec["segments"]:
        while calls < int(seg["start"]):
            dist.all_reduce(one)
            calls += 1
        torch.cuda.synchronize()
        for coll in seg["collectives"]:
            for nbytes in seg.get("sizes", spec["sizes"]):
                iters = int(spec["iters"][str(nbytes)])
                op, total, count_bytes = make_op(coll, nbytes, world, dev)
                times = time_op(op, int(spec["warmup"]), iters)
                calls += int(spec["warmup"]) + iters
                points.append(
                    {
                        "segment": seg["label"],
                        "collective": coll,
                        "nbytes": total,
                        "count_bytes": count_bytes,
                        "times_us": times,
                    }
                )
        _write(spec, {"rank": rank, "calls": calls, "points": points, "complete": False})
    dist.barrier()
    calls += 1
    dist.destroy_process_group()
    return {"rank": rank, "calls": calls, "points": points, "complete": True}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _write(spec, _run(spec, rank, world))
    return 0


if __name__ == "__main__":
    sys.exit(main())

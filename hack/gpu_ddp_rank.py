"""One rank of a real PyTorch DDP training job (hack/gpu_ddp.py starts it; no simulation).

A small MLP (4 x Linear(2048, 2048), 16.8 M parameters, 64 MiB of fp32 gradients in DDP's
25 MiB buckets) trains on random data with SGD; backward overlaps the bucket all-reduces, as in
any DDP job. A DDP communication hook runs the same all-reduce DDP would and times each bucket
with CUDA events from the moment the bucket is ready to the moment it is reduced (so it
includes waiting behind earlier buckets). Step time: wall clock around each step, after a CUDA
synchronize. The first WARMUP steps are not counted.

Arguments: the demo's RankArgs JSON (`rank`, `nranks`, `steps`, `out`, `progress`, `stop`);
the layout env (hack/gpu_layout.py) and, with DynamICCL, the training container's env as the
webhook injected it. Writes the demo's RankReport to `out` and the per-step detail beside it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpu_worker import init

from dynamiccl import constants as c
from dynamiccl.testing.rank import RankArgs, RankReport

WARMUP = 5
WIDTH, DEPTH = 2048, 4


def _timing_hook(events: list[tuple[Any, Any, int]]) -> Any:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    def hook(_state: object, bucket: Any) -> Any:
        t = bucket.buffer()
        t.div_(dist.get_world_size())
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fut = dist.all_reduce(t, async_op=True).get_future()

        def done(f: Any) -> Any:
            stop = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            stop.record()
            events.append((start, stop, t.numel() * t.element_size()))
            return f.value()[0]

        return fut.then(done)

    # DDP checks a hook's annotations against the real types; under `from __future__ import
    # annotations` they are strings ("bucket annotation should be dist.GradBucket", first GPU run)
    hook.__annotations__.clear()
    return hook


def train(args: RankArgs) -> dict[str, Any]:
    """Run the steps; the measured step and bucket times."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    dev = init(args.rank, args.nranks)
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).to(dev), device_ids=[dev])
    events: list[tuple[Any, Any, int]] = []
    model.register_comm_hook(None, _timing_hook(events))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, WIDTH, device=dev)
    steps_s, buckets = [], []
    for step in range(WARMUP + args.steps):
        if Path(args.stop).exists():
            break
        events.clear()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= WARMUP:
            steps_s.append(time.perf_counter() - t0)
            buckets += [(n, a.elapsed_time(b) * 1000.0) for a, b, n in events]
            Path(args.progress).write_text(str(step - WARMUP + 1))
    dist.barrier()
    dist.destroy_process_group()
    return {"step_s": steps_s, "buckets": buckets}


def main() -> int:
    args = RankArgs.model_validate_json(Path(sys.argv[1]).read_text())
    t0 = time.monotonic()
    got = train(args)
    shm = os.environ.get(c.ENV_SHM_PATH, "")
    report = RankReport(
        rank=args.rank,
        calls=len(got["buckets"]),
        seconds=time.monotonic() - t0,
        decisions={},  # NCCL decides inside NCCL: its TUNING lines say what ran
        time_us={"steps": sum(got["step_s"]) * 1e6, "buckets": sum(t for _, t in got["buckets"])},
        mapped=bool(shm) and Path(shm).is_file(),
        boundary_waits=0,
        backpressure_s=0.0,
        log=[],
    )
    Path(args.out).write_text(report.model_dump_json())
    Path(args.out + ".steps.json").write_text(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main())

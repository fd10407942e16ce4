"""The one stand-in of the DDP driver's CPU test: replaces hack/gpu_ddp_rank.py (PyTorch DDP on
a GPU). It trains nothing: it checks the environment a rank gets (the webhook's plugin env with
the pod's files, the one-GPU layout) and writes the rank's report and step file with fixed
times, so the driver's orchestration (operator, webhook, sidecars, ingest) runs end to end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dynamiccl.testing.rank import RankArgs, RankReport

args = RankArgs.model_validate_json(Path(sys.argv[1]).read_text())
need = ["NCCL_HOSTID", "NCCL_NET", "MASTER_PORT", "DYNAMICCL_GPU_DEVICE"]
if os.environ.get("EXPECT_PLUGIN"):
    need += ["NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "DYNAMICCL_SHM_PATH"]
missing = [k for k in need if not os.environ.get(k)]
if missing:
    sys.exit(f"missing env {missing}")
if os.environ.get("EXPECT_PLUGIN") and not Path(os.environ["NCCL_TUNER_PLUGIN"]).is_file():
    sys.exit("the plugin install step did not copy the .so")
steps = {"step_s": [0.01 + 0.001 * args.rank] * args.steps, "buckets": [[4 << 20, 100.0]] * 3}
Path(args.out + ".steps.json").write_text(json.dumps(steps))
report = RankReport(rank=args.rank, calls=3, seconds=0.1, decisions={}, time_us={},
                    mapped=True, boundary_waits=0, backpressure_s=0.0, log=[])  # fmt: skip
Path(args.out).write_text(report.model_dump_json())

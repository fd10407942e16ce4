"""The in-job loop on real NCCL: a PyTorch DDP job with NCCL alone and with DynamICCL.

For N ranks laid out by hack/gpu_layout.py (one GPU: N processes on device 0, each its own NCCL
node over loopback sockets), hack/gpu_ddp_rank.py trains the same model in four runs:

- `nccl`: NCCL alone (no plugin);
- `tuner`: the plugin as tuner only, mapping a shared-memory file with no table (NCCL decides);
- `profiler`: the same plus the plugin as profiler (`tuner` vs `profiler`: the profiler's cost);
- `dynamiccl`: as the webhook injects it. The job (examples/pytorchjob-1gpu-tcp.yaml) on the
  cluster examples/topology-1gpu-tcp.yaml with `nodes: N` goes through the operator's decision
  (its NodeTopology objects, the sample policies, the shipped model's compile-to-table) and
  the admission webhook (`dynamiccl.testing.local_job.create`); each pod's volumes, plugin
  install step, sidecar (`dynamiccl sidecar`, file coordination) and training container env
  come from the mutated pod (`dynamiccl.testing.local_pods.run`), rewards go to the reward
  ingest and its experience store (`dynamiccl.testing.local_ingest`).

Reported per run: step time, per-bucket all-reduce time; for `dynamiccl`: the sidecars' final
reports (epochs, exploration calls and cost), whether every pod's file holds the same committed
tables, and the job's reward summary from the store.

usage: python hack/gpu_ddp.py --ranks N --out DIR --so PATH [--steps S] [--gpus G]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gpu_layout
import gpu_test
import yaml

ROOT = Path(__file__).resolve().parents[1]
RANK = Path(__file__).resolve().with_name("gpu_ddp_rank.py")  # tests substitute a stand-in
TOPOLOGY = ROOT / "examples" / "topology-1gpu-tcp.yaml"
JOB = ROOT / "examples" / "pytorchjob-1gpu-tcp.yaml"


def rank_args(d: Path, rank: int, world: int, steps: int) -> Any:
    """The demo's RankArgs of one rank whose files live in `d`."""
    from dynamiccl.testing.rank import RankArgs  # noqa: PLC0415

    return RankArgs(
        rank=rank, nranks=world, nnodes=world, comm_id=0, steps=steps, ops=[],
        time_table="", seed=0, out=str(d / f"rank{rank}.json"),
        progress=str(d / f"rank{rank}.progress"), stop=str(d / "STOP"), barrier=str(d),
    )  # fmt: skip


def _layout_env(procs: Sequence[gpu_layout.RankProc], rank: int) -> dict[str, str]:
    return dict(procs[rank].env)


def run_plain(mode: str, world: int, gpus: int, *, so: Path, d: Path, steps: int) -> list[Path]:
    """`nccl`, `tuner` or `profiler`: the ranks without operator or sidecar."""
    from dynamiccl.sidecar import shm  # noqa: PLC0415

    d.mkdir(parents=True, exist_ok=True)
    procs = gpu_layout.layout(
        gpus, world, gpu_test._free_port(), debug_file=str(d / "nccl.rank{rank}.log")
    )
    extra: dict[str, str] = {}
    if mode != "nccl":
        shm.create(d / "dynamiccl.shm", 64)
        extra = {"NCCL_TUNER_PLUGIN": str(so), "DYNAMICCL_SHM_PATH": str(d / "dynamiccl.shm")}
    if mode == "profiler":
        extra["NCCL_PROFILER_PLUGIN"] = str(so)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    running = []
    for r in range(world):
        args = rank_args(d, r, world, steps)
        afile = d / f"rank{r}.args.json"
        afile.write_text(args.model_dump_json())
        env = base | extra | _layout_env(procs, r)
        out = (d / f"rank{r}.log").open("w")
        running.append(
            subprocess.Popen(
                [sys.executable, str(RANK), str(afile)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    codes = gpu_test._wait_all(running, 600)
    if any(codes):
        raise RuntimeError(f"{mode}: ranks exited {codes}; see {d}/rank*.log")
    return [d / f"rank{r}.json.steps.json" for r in range(world)]


def job_manifest(world: int) -> dict[str, Any]:
    """The example job with `world` pods of one process (Master + world - 1 Workers)."""
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = world - 1
    job["metadata"]["annotations"]["dynamiccl.io/parallelism"] = f"dp:dp={world}"
    return job


def run_dynamiccl(world: int, gpus: int, so: Path, d: Path, steps: int) -> dict[str, Any]:
    """The job through the operator and the webhook, its pods run with their sidecars."""
    from dynamiccl.api.topology import TopologySpec  # noqa: PLC0415
    from dynamiccl.operator.controller.job_table import shipped_compiler  # noqa: PLC0415
    from dynamiccl.operator.controller.policy_match import parse_policies  # noqa: PLC0415
    from dynamiccl.operator.learning.reward_status import reward_status  # noqa: PLC0415
    from dynamiccl.testing.auth import TokenIssuer  # noqa: PLC0415
    from dynamiccl.testing.local_ingest import IngestService  # noqa: PLC0415
    from dynamiccl.testing.local_job import (  # noqa: PLC0415
        IMAGE,
        NAMESPACE_LABELS,
        Cluster,
        create,
        load_policies,
    )
    from dynamiccl.testing.local_pods import (  # noqa: PLC0415
        RunConfig,
        run,
        sidecar_command,
        sidecar_reports,
    )

    spec = TopologySpec.model_validate(yaml.safe_load(TOPOLOGY.read_text()))
    spec = spec.model_copy(update={"nodes": world})
    compiler = shipped_compiler()
    if compiler is None:
        raise RuntimeError("no compiler: the policy package's compile-to-table is missing")
    issuer = TokenIssuer(secrets.token_bytes(32))
    ingest = IngestService(d / "ingest", d / "store.sqlite", issuer)
    try:
        inc = create(
            job_manifest(world), Cluster.of(spec, "ml-team", NAMESPACE_LABELS),
            parse_policies(load_policies())[0],
            rng=random.Random(0), image=IMAGE, ingest_url=ingest.url, ingest_ca=ingest.ca_pem,
            compiler=compiler,
        )  # fmt: skip
        for pod in inc.pods:
            ingest.resolver.add_pod(pod)
        port = gpu_test._free_port()
        procs = gpu_layout.layout(gpus, world, port, debug_file=str(d / "nccl.rank{rank}.log"))

        def rank_command(
            args: Any, afile: Path, env: Mapping[str, str]
        ) -> tuple[list[str], dict[str, str]]:
            return [sys.executable, str(RANK), str(afile)], dict(env) | _layout_env(
                procs, args.rank
            )

        def token_for(pod: Mapping[str, Any]) -> str:
            meta = pod["metadata"]
            sa = str((pod.get("spec") or {}).get("serviceAccountName", "default"))
            return issuer.issue(meta["namespace"], sa, meta["name"], meta["uid"])

        cfg = RunConfig(
            steps=steps, seed=0, time_table=d / "unused", image_lib=so.parent, ops=[],
            sidecar=sidecar_command(d / "job-record"),
            rank_command=rank_command,
        )  # fmt: skip
        result = run(inc, cfg, d, token_for)
        status = reward_status(ingest.store.job_summary(inc.uid)).patch()["status"]
    finally:
        ingest.close()
    return {
        "decision": inc.message,
        "model_version": inc.model_version,
        "table_cells": len(inc.table().get("cells", [])),
        "sidecars": sidecar_reports(result),
        "sidecar_exit": result.sidecar_exit,
        "tables_agreed": tables_agreed(sorted(d.rglob("*.shm"))),
        "reward": status.get("reward"),
    }


def tables_agreed(files: Sequence[Path]) -> dict[str, Any]:
    """Every pod's committed epochs (boundary, table digest): equal in every file?"""
    from dynamiccl.sidecar import shm, shm_table  # noqa: PLC0415

    per_file = []
    for path in files:
        with shm.ShmFile(path) as f:
            epochs = []
            for e in range(1, shm_table.MAX_EPOCHS):
                status, boundary = f.entry(e)
                if status == shm.EPOCH_COMMITTED:
                    digest = hashlib.sha256(f.read_table(e)).hexdigest()[:16]
                    epochs.append((e, boundary, digest))
            per_file.append(epochs)
    return {
        "files": len(per_file),
        "committed_epochs": [len(x) for x in per_file],
        "agreed": len(per_file) > 0 and all(x == per_file[0] for x in per_file),
    }


def step_stats(files: Sequence[Path]) -> dict[str, Any]:
    """Step time (per step the slowest rank) and bucket all-reduce times, over the ranks' files."""
    got = [json.loads(p.read_text()) for p in files]
    steps = [max(s) for s in zip(*(g["step_s"] for g in got), strict=False)]
    buckets = [t for g in got for _, t in g["buckets"]]
    return {
        "steps": len(steps),
        "step_ms_mean": round(statistics.fmean(steps) * 1e3, 3) if steps else None,
        "step_ms_sd": round(statistics.stdev(steps) * 1e3, 3) if len(steps) > 1 else None,
        "buckets_per_step": round(len(buckets) / max(len(steps) * len(got), 1), 2),
        "bucket_us_mean": round(statistics.fmean(buckets), 1) if buckets else None,
    }


def overhead(tuner: Mapping[str, Any], profiler: Mapping[str, Any]) -> float | None:
    """The profiler's share of step time: profiler run over tuner-only run, minus one."""
    a, b = tuner.get("step_ms_mean"), profiler.get("step_ms_mean")
    return round(b / a - 1.0, 4) if a and b else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=0, help="default: the GPUs torch sees")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--so", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    gpus = args.gpus or gpu_test.gpu_count()[0]
    so, world = args.so.resolve(), args.ranks
    out: dict[str, Any] = {"ranks": world, "errors": {}}
    dest = args.out / f"ddp-{world}.json"
    # NCCL alone and DynamICCL first: a run that fails or is stopped keeps what came before it
    for mode in ("nccl", "dynamiccl", "tuner", "profiler"):
        d = args.out / f"ddp-{world}-{mode}"
        t0 = time.monotonic()
        try:
            if mode == "dynamiccl":
                out["dynamiccl_loop"] = run_dynamiccl(world, gpus, so, d, args.steps)
                out[mode] = step_stats(sorted(d.rglob("rank*.json.steps.json")))
            else:
                out[mode] = step_stats(run_plain(mode, world, gpus, so=so, d=d, steps=args.steps))
        except Exception as exc:  # reported, and the next run still runs
            out["errors"][mode] = f"{type(exc).__name__}: {exc}"[:2000]
        out.setdefault("seconds", {})[mode] = round(time.monotonic() - t0, 1)
        out["profiler_overhead"] = overhead(out.get("tuner", {}), out.get("profiler", {}))
        dest.write_text(json.dumps(out, indent=1, default=str))
    print(
        f"gpu-ddp: {world} ranks: "
        + json.dumps({k: out.get(k) for k in ("nccl", "dynamiccl", "profiler_overhead", "errors")}),
        flush=True,
    )
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

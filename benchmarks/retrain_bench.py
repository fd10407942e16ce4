"""Retraining from a large experience store: wall time and peak memory of `train --from-store`.

Reproduce:  .venv/bin/python benchmarks/retrain_bench.py [--rows 1000000] [--jobs 200] [--json]

Builds an SQLite store (the operator's schema, via its migrations) holding
`--rows` experience rows of `--jobs` jobs with their stored features (two
hardware shapes; per job, reward records of 5 collectives x 12 size buckets x
several configurations x flush intervals, as sidecars send them), then runs the
retraining Job's command line as a child process — the shipped model fine-tuned
on every row (`policy/train/store_data.py` streams them), then the held-out
simulator evaluation with `--eval-jobs` jobs — and reports its wall time and
the child's peak RSS (getrusage). Targets (issue 17): <= 10 min, <= 4 GB on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dynamiccl.api.features import StateFeatures
from dynamiccl.operator.learning.features_sync import hardware_class
from dynamiccl.operator.store.experience import open_store

COLLS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
CONFIGS = (
    ("ring", "simple"),
    ("ring", "ll128"),
    ("tree", "simple"),
    ("ring", "ll"),
    ("tree", "ll128"),
)


def job_features(nodes: int) -> dict[str, Any]:
    node = {
        "name": "h100", "gpu": "H100", "gpus_per_node": 8, "nodes": nodes, "intra": "nvswitch",
        "nvlink_GBps": 450, "nvls": False, "pcie_gen": 5, "nics_per_node": 8, "nic_Gbps": 400,
        "fabric": "infiniband", "sharp": False, "tier_max": "same_rack",
        "tier_mix": {"same_node": 0.25, "same_rack": 0.75},
    }  # fmt: skip
    doc = {"world_size": 8 * nodes, "gpus_per_pod": 8, "replicas": nodes, "nproc_per_node": 8,
           "scheduled": True, "topology": node}  # fmt: skip
    return StateFeatures.model_validate(doc).model_dump(mode="json")


def build(path: Path, rows: int, jobs: int, seed: int) -> float:
    """The store with `rows` rows; seconds it took."""
    t0 = time.monotonic()
    open_store(f"sqlite:///{path}").close()
    rng = random.Random(seed)
    db = sqlite3.connect(path)
    feats = {n: job_features(n) for n in (2, 4)}
    per_job = rows // jobs
    for j in range(jobs):
        nodes = 2 if j % 2 else 4
        f = feats[nodes]
        uid = f"job-{j:05d}"
        db.execute(
            "INSERT INTO job_features VALUES (?, 'ns', ?, ?, 1, ?, 0)",
            (uid, uid, hardware_class(f), json.dumps(f)),
        )
        batch = []
        for i in range(per_job):
            coll = COLLS[i % 5]
            bucket = 14 + (i // 5) % 12
            algo, proto = CONFIGS[(i // 60) % len(CONFIGS)]
            if coll != "allreduce" and algo == "tree":
                algo = "ring"
            mean = 10.0 + 2.0 ** (bucket - 14) * rng.uniform(0.9, 1.1)
            origin = "default" if algo == "ring" and proto == "simple" else "explore"
            batch.append((
                f"pod-{uid}/{i // 512}", "ns", "PyTorchJob", uid, uid, f"pod-{uid}", "default", 1,
                float(i), coll, bucket, 1 << bucket, (2 << bucket) - 1, 8 * nodes, nodes, algo,
                proto, 0, 0, origin, rng.randint(1, 500), mean, mean, mean * 1.2, 1.0,
                mean * rng.uniform(0.95, 1.05),
            ))  # fmt: skip
        db.executemany(
            "INSERT INTO experience (idempotency_key, namespace, job_kind, job_name, job_uid, "
            "pod_uid, model_version, table_version, received_unix_s, collective, size_bucket, "
            "nbytes_min, nbytes_max, nranks, nnodes, algo, proto, nchannels, chunk_bytes, origin, "
            "count, mean_time_us, p50_time_us, p99_time_us, busbw_gbps, nccl_default_time_us) "
            f"VALUES ({', '.join('?' * 26)})",
            batch,
        )
        db.commit()
    db.close()
    return time.monotonic() - t0


def retrain(store: Path, out: Path, eval_jobs: int) -> dict[str, Any]:
    out.parent.mkdir(parents=True, exist_ok=True)
    config = out.parent / "train.yaml"
    config.write_text(yaml.safe_dump({"eval_jobs": eval_jobs, "threads": 2}))
    argv = [sys.executable, "-m", "dynamiccl.cli", "train", "--from-store", f"sqlite:///{store}",
            "--out", str(out), "--version", "bench", "--config", str(config), "--json"]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"train failed: {done.stderr[-2000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    doc = json.loads(done.stdout[done.stdout.index("{") :])
    m = doc.get("metrics", {})
    return {
        "retrain_seconds": round(wall, 1),
        "peak_rss_gib": round(peak_kib / 2**20, 3),
        "rows_read": m.get("offline/records"),
        "rows_used": m.get("offline/used"),
        "skipped": {k: v for k, v in m.items() if k.startswith("offline/skipped_") and v},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--eval-jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store.sqlite"
        built = build(store, args.rows, args.jobs, args.seed)
        mib = round(store.stat().st_size / 2**20, 1)
        result = {"rows": args.rows, "jobs": args.jobs, "eval_jobs": args.eval_jobs,
                  "build_seconds": round(built, 1), "store_mib": mib,
                  **retrain(store, Path(tmp) / "models" / "bench", args.eval_jobs)}  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}: {v}")


if __name__ == "__main__":
    main()

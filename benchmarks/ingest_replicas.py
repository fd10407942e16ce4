"""`ingest_bench.py --replicas 1,2,4`: N ingest replicas on one PostgreSQL store, one run.

N ingest processes (the benchmark's server) on one PostgreSQL store, `--sidecars`
spread over them; every `--dup-every`-th acknowledged batch is sent again to another
replica and must answer `duplicate`. Exactly once is checked in the store:
batches = rows / records-per-batch = batches acknowledged. CPU is the ingest
processes' (PostgreSQL's own is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ingest_bench import _clients, _proc_cpu, _server

from dynamiccl.operator.store.experience import open_store
from dynamiccl.testing.certs import write_self_signed
from dynamiccl.testing.postgres import PgServer


def run_replicas(replicas: int, *, args: argparse.Namespace, crt: str, key: str) -> dict[str, Any]:
    """`replicas` ingest processes on one PostgreSQL store; sidecars spread over them, every
    `--dup-every`-th batch resent to another replica. Exactly once: rows = batches acked."""
    pg = PgServer(fsync=True)
    pg.start()
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    try:
        open_store(pg.url).close()  # migrate once, before the replicas start
        for _ in range(replicas):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_server, args=(pg.url, crt, key, 64, child))
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        ports = [p.recv() for p in pipes]
        cpu0 = [_proc_cpu(p.pid) or 0.0 for p in procs]
        res = asyncio.run(
            _clients(
                ports,
                crt,
                concurrency=args.sidecars,
                records=args.records,
                warmup_s=args.warmup,
                duration_s=args.duration,
                dup_every=args.dup_every,
            )
        )
        cpu = sum((_proc_cpu(p.pid) or 0.0) - c0 for p, c0 in zip(procs, cpu0, strict=True))
        for p in pipes:
            p.send("stop")
            p.recv()
        s = open_store(pg.url, migrate=False)
        stored_batches, stored_rows = s.batch_count(), s.count_experience()
        s.close()
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        pg.stop()
    share = args.duration / (args.duration + args.warmup)  # CPU of the measured window
    return {
        "replicas": replicas,
        **res,
        "ingest_cpu_s_per_1k_batches": cpu * share / max(res["batches"], 1) * 1000,
        "stored_batches": stored_batches,
        "stored_rows": stored_rows,
        "exactly_once": stored_batches == res["acked_total"]
        and stored_rows == res["acked_total"] * args.records
        and res["resent_answered_duplicate"] == res["resent"],
    }


def _replicas_report(meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print(f"ingest replicas benchmark (PostgreSQL store): {meta}")
    print(
        f"{'replicas':>8} {'batches/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'cpu s/1k':>9} "
        f"{'acked':>7} {'resent':>7} {'rows':>8} exactly-once"
    )
    base = results[0]["batches_per_s"] or 1e-9
    for r in results:
        print(
            f"{r['replicas']:8d} {r['batches_per_s']:10.0f} {r['p50_ms']:8.2f} "
            f"{r['p99_ms']:8.2f} {r['ingest_cpu_s_per_1k_batches']:9.2f} "
            f"{r['acked_total']:7d} {r['resent']:7d} {r['stored_rows']:8d} "
            f"{'ok' if r['exactly_once'] else 'MISMATCH'}  "
            f"({r['batches_per_s'] / base:.2f}x one replica)"
        )


def main_replicas(args: argparse.Namespace) -> int:
    try:
        counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    except ValueError:
        print(f"--replicas: expected integers, got {args.replicas!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as d:
        crt, key = write_self_signed(Path(d) / "tls")
        results = [run_replicas(n, args=args, crt=str(crt), key=str(key)) for n in counts]
    meta = {
        "cpus": os.cpu_count(),
        "sidecars": args.sidecars,
        "records_per_batch": args.records,
        "duration_s": args.duration,
        "resend_one_in": args.dup_every,
        "command": " ".join([".venv/bin/python", "benchmarks/ingest_bench.py", *sys.argv[1:]]),
    }
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2))
    else:
        _replicas_report(meta, results)
    return 0 if all(r["exactly_once"] for r in results) else 1

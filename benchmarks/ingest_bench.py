#!/usr/bin/env python3
"""Reward-ingest throughput and latency: HTTPS + validation + auth + durable store.

    .venv/bin/python benchmarks/ingest_bench.py                 # SQLite and PostgreSQL
    .venv/bin/python benchmarks/ingest_bench.py --backends sqlite --duration 5 --json
    .venv/bin/python benchmarks/ingest_bench.py --replicas 1,2,4   # N replicas, one PostgreSQL

Each configuration starts the ingest server (`IngestService`, TLS, the real
SQLite/PostgreSQL store with durable commits) in its own process, then
`--concurrency` simulated sidecars (one aiohttp client process, keep-alive
connections) send batches of `--records` reward records as fast as the server
answers, for `--duration` seconds after a warm-up. Reported: batches/s,
records/s, client-side latency p50/p99, server CPU seconds per 1000 batches.

Baseline in the same run: the same server with group commit disabled
(`max_group=1`: one transaction and one fsync per batch), so the ratio shows
what group commit buys. Authentication: TokenReview answers are cached per
token in production (a sidecar reuses its token for its lifetime), so the
steady state never waits for the API server; the benchmark replaces the API
server at the `TokenReviewer` / `PodJobResolver` / `TunedJobs` interfaces by a
table lookup behind the real caches, i.e. it measures the cache-hit path
(pod → job, job → assigned model version included) and the rate limiter (with
limits no sidecar here reaches). PostgreSQL runs with fsync on (dynamiccl/testing/postgres.py).
Client and server share the machine's cores: the numbers are a lower bound.

`--replicas 1,2,4`: N ingest processes on one PostgreSQL store in one run,
`--sidecars` spread over them; every `--dup-every`-th acknowledged batch is sent
again to another replica and must answer `duplicate`. Exactly once is checked
in the store: batches = rows / records-per-batch = batches acknowledged. CPU is
the ingest processes' (PostgreSQL's own is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from dynamiccl.api.rewards import JobRef
from dynamiccl.operator.ingest.auth import Caller
from dynamiccl.operator.ingest.main import IngestService
from dynamiccl.operator.ingest.ratelimit import Limit
from dynamiccl.operator.ingest.settings import IngestSettings
from dynamiccl.operator.store.experience import open_store
from dynamiccl.testing.certs import write_self_signed
from dynamiccl.testing.postgres import PgServer


# --- server process -------------------------------------------------------------------
def _server(store_url: str, crt: str, key: str, max_group: int, conn: Any) -> None:
    class TableAuth:
        async def review(self, token: str, audience: str) -> Caller | None:
            i = token.removeprefix("tok-")
            return Caller(
                f"system:serviceaccount:bench:sc{i}", "bench", "sc", f"pod-{i}", f"uid-{i}"
            )

        async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
            return JobRef(namespace="bench", kind="PyTorchJob", name="job", uid="job-uid")

        async def assigned_model(self, job: JobRef) -> str | None:
            return "v1"  # the TuningRun's model version (cached per job, like the pod's job)

    async def run() -> None:
        auth = TableAuth()
        svc = IngestService(
            IngestSettings(
                store_url,
                Path(crt),
                Path(key),
                host="127.0.0.1",
                port=0,
                max_group=max_group,
                # the rate limiter runs on every request, with limits no sidecar here reaches
                rate_pod=Limit(1e9, 1e9),
                rate_job=Limit(1e9, 1e9),
            ),
            reviewer=auth,
            resolver=auth,
            tuned=auth,
        )
        port = await svc.start()
        conn.send(port)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # wait for "stop"
        cpu = os.times()
        await svc.stop()
        conn.send({"cpu_s": cpu.user + cpu.system, "stored": None})

    asyncio.run(run())


# --- client -----------------------------------------------------------------------------
def _batch(sidecar: int, seq: int, records: int) -> bytes:
    recs = [
        {
            "collective": ("allreduce", "allgather", "reducescatter")[r % 3],
            "size_bucket": 10 + r // 3,
            "nbytes_min": 1 << (10 + r // 3),
            "nbytes_max": (2 << (10 + r // 3)) - 1,
            "nranks": 64,
            "nnodes": 8,
            "algo": "ring",
            "proto": "simple",
            "nchannels": 8,
            "chunk_bytes": 0,
            "origin": "table",
            "count": 100 + seq % 7,
            "mean_time_us": 120.5 + r,
            "p50_time_us": 118.0 + r,
            "p99_time_us": 180.0 + r,
            "busbw_GBps": 42.0,
            "nccl_default_time_us": 131.0 + r,
        }
        for r in range(records)
    ]
    body = {
        "idempotency_key": f"uid-{sidecar}/{seq}",
        "job": {"namespace": "bench", "kind": "PyTorchJob", "name": "job", "uid": "job-uid"},
        "pod": {"name": f"pod-{sidecar}", "uid": f"uid-{sidecar}"},
        "model_version": "v1",
        "table_version": 1,
        "records": recs,
    }
    return json.dumps(body).encode()


async def _clients(
    ports: list[int],
    crt: str,
    *,
    concurrency: int,
    records: int,
    warmup_s: float,
    duration_s: float,
    dup_every: int = 0,
) -> dict[str, Any]:
    """Sidecar i sends to replica i mod len(ports); with `dup_every`, every such batch is
    sent again to the next replica (a retry that went elsewhere) and must be a duplicate."""
    ctx = ssl.create_default_context(cafile=crt)
    urls = [f"https://127.0.0.1:{p}/v1/rewards" for p in ports]
    lat: list[float] = []
    done = 0
    errors = 0
    acked = 0
    resent = 0
    dup_answers = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s

    async def sidecar(i: int) -> None:
        nonlocal done, errors, acked, resent, dup_answers
        conn = aiohttp.TCPConnector(ssl=ctx, limit=2)
        async with aiohttp.ClientSession(connector=conn) as s:
            seq = 0
            headers = {"Authorization": f"Bearer tok-{i}", "Content-Type": "application/json"}
            while (now := time.perf_counter()) < t_end:
                body = _batch(i, seq, records)
                seq += 1
                async with s.post(urls[i % len(urls)], data=body, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
                t1 = time.perf_counter()
                acked += ok
                if ok and dup_every and seq % dup_every == 0:
                    again = urls[(i + 1) % len(urls)]
                    async with s.post(again, data=body, headers=headers) as r:
                        doc = await r.json()
                        resent += 1
                        dup_answers += r.status == 200 and doc.get("duplicate") is True
                if now >= t_measure:
                    if ok:
                        lat.append(t1 - now)
                        done += 1
                    else:
                        errors += 1

    await asyncio.gather(*(sidecar(i) for i in range(concurrency)))
    lat.sort()

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    return {
        "batches": done,
        "acked_total": acked,
        "resent": resent,
        "resent_answered_duplicate": dup_answers,
        "errors": errors,
        "batches_per_s": done / duration_s,
        "records_per_s": done * records / duration_s,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


def run_one(
    backend: str,
    *,
    max_group: int,
    concurrency: int,
    args: argparse.Namespace,
    tmp: Path,
    crt: str,
    key: str,
) -> dict[str, Any]:
    pg = None
    if backend == "sqlite":
        store_url = f"sqlite:///{tmp / f'bench-{max_group}-{concurrency}.db'}"
    else:
        pg = PgServer(fsync=True)
        pg.start()
        store_url = pg.url
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_server, args=(store_url, crt, key, max_group, child))
    proc.start()
    try:
        port = parent.recv()
        cpu0 = _proc_cpu(proc.pid)
        res = asyncio.run(
            _clients(
                [port],
                crt,
                concurrency=concurrency,
                records=args.records,
                warmup_s=args.warmup,
                duration_s=args.duration,
            )
        )
        cpu1 = _proc_cpu(proc.pid)
        parent.send("stop")
        parent.recv()
        proc.join(30)
        s = open_store(store_url, migrate=False)
        stored_batches = s.batch_count()
        s.close()
    finally:
        if proc.is_alive():
            proc.kill()
        if pg is not None:
            pg.stop()
    server_cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else float("nan")
    return {
        "backend": backend,
        "concurrency": concurrency,
        "group_commit": max_group > 1,
        **res,
        "server_cpu_s_per_1k_batches": server_cpu
        / max(res["batches"], 1)
        * 1000
        * (args.duration / (args.duration + args.warmup)),
        "stored_batches": stored_batches,
        "stored_equals_acked": stored_batches == res["acked_total"],
    }


def _proc_cpu(pid: int | None) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--concurrency", default="4,32", help="simulated sidecars (comma list)")
    p.add_argument("--records", type=int, default=20, help="records per batch")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--replicas", default="", help="e.g. 1,2,4: N ingest replicas on one PostgreSQL store"
    )
    p.add_argument("--sidecars", type=int, default=32, help="with --replicas")
    p.add_argument("--dup-every", type=int, default=5, help="with --replicas: resend 1 in N")
    args = p.parse_args()
    if args.replicas:
        from ingest_replicas import main_replicas  # noqa: PLC0415 - benchmarks/, on demand

        return main_replicas(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        print(f"--concurrency: expected integers, got {args.concurrency!r}", file=sys.stderr)
        return 2
    for b in backends:
        if b not in ("sqlite", "postgres"):
            print(f"--backends: unknown backend {b!r} (sqlite, postgres)", file=sys.stderr)
            return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as d:
        tmp = Path(d)
        crt, key = write_self_signed(tmp / "tls")
        for backend in backends:
            for conc in levels:
                for max_group in (64, 1):
                    results.append(
                        run_one(
                            backend,
                            max_group=max_group,
                            concurrency=conc,
                            args=args,
                            tmp=tmp,
                            crt=str(crt),
                            key=str(key),
                        )
                    )
    for g in results:
        if g["group_commit"]:
            n = next(
                r
                for r in results
                if (r["backend"], r["concurrency"], r["group_commit"])
                == (g["backend"], g["concurrency"], False)
            )
            g["speedup_vs_no_group_commit"] = g["batches_per_s"] / max(n["batches_per_s"], 1e-9)
    meta = {
        "cpus": os.cpu_count(),
        "concurrency": levels,
        "records_per_batch": args.records,
        "duration_s": args.duration,
        "command": " ".join([".venv/bin/python", "benchmarks/ingest_bench.py", *sys.argv[1:]]),
    }
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2))
        return 0
    print(f"ingest benchmark: {meta}")
    hdr = (
        f"{'backend':9} {'conc':>4} {'group':6} {'batches/s':>10} {'records/s':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'cpu s/1k':>9} {'errors':>6} stored=acked"
    )
    print(hdr)
    for r in results:
        print(
            f"{r['backend']:9} {r['concurrency']:4d} {r['group_commit']!s:6} "
            f"{r['batches_per_s']:10.0f} "
            f"{r['records_per_s']:10.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{r['server_cpu_s_per_1k_batches']:9.2f} {r['errors']:6d} "
            f"{'ok' if r['stored_equals_acked'] else 'MISMATCH'}"
        )
    for r in results:
        if "speedup_vs_no_group_commit" in r:
            print(
                f"{r['backend']} x{r['concurrency']}: group commit = "
                f"{r['speedup_vs_no_group_commit']:.2f}x the batches/s of one commit per batch"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

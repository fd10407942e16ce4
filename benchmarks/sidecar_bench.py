#!/usr/bin/env python3
"""Sidecar CPU per 10k collectives/s: `dynamiccl agent` draining a ring fed at a fixed rate.

    .venv/bin/python benchmarks/sidecar_bench.py                       # 0 (idle), 1k, 10k /s
    .venv/bin/python benchmarks/sidecar_bench.py --rates 10000 --duration 20 --json
    .venv/bin/python benchmarks/sidecar_bench.py --tuner --compare /tmp/old  # tuner only
    .venv/bin/python benchmarks/sidecar_bench.py --rates 10000 --compare /tmp/old --repeats 3

`--tuner`: the online tuner's own CPU per attributed call (`agent.tuning.Tuning.observe`,
the sidecar's configuration: a 16-call epoch per table round, each round 64 calls of
every cell (`Tuning.end_round` counted in), the bench's table of 24 tuned cells, NCCL's
picks from the job's features), each call taking the configuration the cell's plan draws
for the plugin's call counter, with lognormal 3 % times. Process CPU
time over `--calls` calls, best of `--repeats` runs, in a fresh interpreter per run.
With `--compare TREE` the same runs, interleaved, use the code of another checkout
(e.g. `git worktree add /tmp/old HEAD~1`), so both are measured in the same run.

One `dynamiccl agent` process (the real command, mode ``learned``: attribution,
aggregation, NCCL baseline, the online tuner per cell, the durable spool with
its per-pass state file, batches sent to a local HTTP endpoint that answers
200) runs on a shared-memory file whose profiler ring a feeder process fills
at `rate` records per second, exactly as the plugin does (body first, then the
sequence word; `head` claimed; a full ring drops and counts). The feeder
mixes 4 collectives x 6 sizes over one registered 8-rank communicator.

Measured over `--duration` seconds after a warm-up: the sidecar's CPU time
(user + system from /proc/<pid>/stat) per wall second, i.e. the fraction of
one core it needs, and the records it read (from its own metrics) vs those
fed. Baseline in the same run: the same sidecar with no records (rate 0), so
the ratio shows the per-record cost above its idle loop. The feeder and the
sidecar share the machine's 2 cores with whatever else runs: CPU *time* is
what is compared, not wall time.

With `--compare TREE` (and no `--tuner`): the sidecar's CPU per record read (its CPU
time over the records it read, idle loop included) at each rate, this checkout's
sidecar and TREE's alternated `--repeats` times, each run in a fresh interpreter whose
`dynamiccl` (sidecar, shared-memory layout, feeder's record layout) is that tree's;
best of the repeats and the ratio this / compare (issue 31: the sidecar before the
step-time work is `git worktree add /tmp/old a7f101e~1`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SIDECAR_BENCH_TREE", str(ROOT)))  # --compare: another tree

from dynamiccl.agent import shm  # noqa: E402
from dynamiccl.agent.ring import RECORD_DTYPE  # noqa: E402
from dynamiccl.api.features import StateFeatures  # noqa: E402
from dynamiccl.api.nccl import Algo, Collective, Proto  # noqa: E402
from dynamiccl.api.table import (  # noqa: E402
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)

COMM = 0xB0B
NRANKS, NNODES = 8, 1
SIZES = tuple(1 << b for b in (12, 16, 20, 22, 24, 26))
COLLS = (4, 2, 3, 0)
NODE = {
    "name": "dgx-h100",
    "gpu": "H100",
    "gpus_per_node": 8,
    "nodes": 1,
    "intra": "nvswitch",
    "nvlink_GBps": 450,
    "nvls": True,
    "pcie_gen": 5,
    "nics_per_node": 8,
    "nic_Gbps": 400,
    "fabric": "infiniband",
    "sharp": False,
}


def write_config(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    f = StateFeatures.model_validate(
        {"world_size": 8, "gpus_per_pod": 8, "replicas": 1, "nproc_per_node": 8, "topology": NODE}
    )
    sc = scale_class(NRANKS, NNODES)
    cells = [
        Cell(
            collective=list(Collective)[c],
            bucket=n.bit_length() - 1,
            scale=sc,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL128),),
            candidates=(
                Candidate(algo=Algo.RING, proto=Proto.SIMPLE, weight=100),
                Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, weight=60),
                Candidate(algo=Algo.RING, proto=Proto.LL, nchannels=8, weight=30),
            ),
            explore=0.25,
        )
        for c in COLLS
        for n in SIZES
    ]
    table = DecisionTable(
        version=1, scales=(sc,), cells=tuple(cells), explore=ExploreSchedule(seed=1)
    )
    (d / "features.json").write_text(f.model_dump_json())
    (d / "table.json").write_text(table.model_dump_json())
    (d / "exploration.json").write_text(
        json.dumps({"mode": "learned", "exploration": {"budgetCalls": 1000000}})
    )
    (d / "job.json").write_text(
        json.dumps({"namespace": "bench", "name": "llm", "kind": "PyTorchJob", "uid": "job-uid"})
    )


def register(path: Path) -> None:
    """The communicator registry entry the plugin would write (state READY last)."""
    with path.open("r+b") as f:
        f.seek(shm.COMMS_OFF + 8)
        f.write(struct.pack("<QQ", COMM, NRANKS | NNODES << 32))
        f.seek(shm.COMMS_OFF)
        f.write(struct.pack("<Q", shm.COMM_READY))


def feed(path: Path, rate: float, seconds: float, out: Path) -> None:
    """The feeder process: `rate` records/s into slot 0's ring, as the plugin writes them."""
    import mmap  # noqa: PLC0415

    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, shm.FILE_SIZE)
    os.close(fd)
    base = shm.PROCS_OFF
    hdr = np.frombuffer(mm, dtype="<u8", count=32, offset=base)
    ring = np.frombuffer(
        mm, dtype=RECORD_DTYPE, count=shm.RING_CAP, offset=base + shm.PROC_HDR_SIZE
    )
    hdr[0] = os.getpid()  # owner
    rng = random.Random(1)
    head, fed, dropped = int(hdr[8]), 0, 0
    t0 = time.monotonic()
    tick = 0.005
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) * rate) - fed - dropped
        tail = int(hdr[16])
        room = shm.RING_CAP - (head - tail)
        n = min(due, max(room, 0))
        dropped += due - n
        if n > 0:
            pos = np.arange(head, head + n, dtype=np.uint64)
            idx = (pos % shm.RING_CAP).astype(np.intp)
            recs = np.zeros(n, dtype=RECORD_DTYPE)
            picks = [
                (rng.choice(COLLS), rng.choice(SIZES), rng.choice((1, 0)), rng.choice((1, 2)))
                for _ in range(n)
            ]
            recs["comm_id"] = COMM
            recs["coll"] = [p[0] for p in picks]
            recs["nbytes"] = [p[1] for p in picks]
            recs["algo"] = [p[2] for p in picks]
            recs["proto"] = [p[3] for p in picks]
            recs["nchannels"] = 16
            recs["exec_ns"] = [
                int(1000 + p[1] / 200 * (1 + 0.1 * p[3]) * rng.lognormvariate(0, 0.03))
                for p in picks
            ]
            recs["coll_seq"] = pos
            recs["n_kernel_ch"] = 16
            body = recs.copy()
            body["seq"] = 0
            ring[idx] = body  # bodies first ...
            ring["seq"][idx] = pos + 1  # ... then the sequence words (x86: stores stay in order)
            head += n
            hdr[8] = head
            fed += n
        time.sleep(tick)
    out.write_text(json.dumps({"fed": fed, "dropped": dropped}))


class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        raw = b'{"accepted": 1, "duplicate": false}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def run(rate: float, duration: float, warmup: float, tmp: Path, url: str) -> dict[str, Any]:
    d = tmp / f"rate-{int(rate)}"
    cfg = d / "config"
    write_config(cfg)
    path = d / "dynamiccl.shm"
    shm.create(path, 256)
    register(path)
    token = d / "token"
    token.write_text("bench")
    port = 20000 + random.Random(rate).randrange(20000)
    agent = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl.cli", "agent", "--config-dir", str(cfg),
         "--shm", str(path), "--pod-name", "bench-0", "--pod-uid", "bench-uid",
         "--coordination", "none", "--ingest-url", url, "--token-file", str(token),
         "--metrics-port", str(port), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert agent.stdout is not None
    json.loads(agent.stdout.readline())  # started
    stats = d / "feeder.json"
    feeder = None
    if rate > 0:
        feeder = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--feed",
                str(path),
                str(rate),
                str(warmup + duration + 1),
                str(stats),
            ]
        )
    time.sleep(warmup)
    c0, r0, t0 = (
        cpu_seconds(agent.pid),
        metric(port, "dynamiccl_agent_ring_records_total"),
        time.monotonic(),
    )
    time.sleep(duration)
    c1, r1, t1 = (
        cpu_seconds(agent.pid),
        metric(port, "dynamiccl_agent_ring_records_total"),
        time.monotonic(),
    )
    if feeder is not None:
        feeder.wait(60)
    time.sleep(1.0)
    read_total = metric(port, "dynamiccl_agent_ring_records_total")
    acked = metric(port, "dynamiccl_agent_acknowledged_calls")
    agent.terminate()
    agent.wait(60)
    fed = json.loads(stats.read_text()) if rate > 0 else {"fed": 0, "dropped": 0}
    wall = t1 - t0
    return {
        "rate": rate,
        "cpu_core_fraction": (c1 - c0) / wall,
        "records_per_s_read": (r1 - r0) / wall,
        "fed": fed["fed"],
        "ring_dropped": fed["dropped"],
        "read_total": read_total,
        "acknowledged_calls": acked,
    }


def tuner_cpu(calls: int) -> float:
    """CPU seconds per call of `Tuning.observe` (run in a fresh interpreter: `--tuner-run`)."""
    from dynamiccl.agent.baseline import NcclDefaults  # noqa: PLC0415
    from dynamiccl.agent.tuning import Tuning  # noqa: PLC0415
    from dynamiccl.policy.online.tuner import TunerConfig  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        write_config(Path(tmp))
        table = DecisionTable.model_validate_json((Path(tmp) / "table.json").read_text())
        feats = StateFeatures.model_validate_json((Path(tmp) / "features.json").read_text())
    # AgentConfig.tuner() for this bench's policy: a 16-call epoch per table round, each
    # round 64 calls of every cell (--compare with a tree before rounds: 64-call epochs)
    rounds = "rounds" in {f.name for f in dataclasses.fields(Tuning)}
    cfg = TunerConfig.model_validate(
        {"refine": 0.5, "budget_calls": 1_000_000, "epoch_calls": 16 if rounds else 64}
    )
    extra: dict[str, Any] = {"rounds": True} if rounds else {}
    if cfg.race is not None and "probe_pairs" in type(cfg.race).model_fields:  # --compare: older
        cfg = cfg.model_copy(update={"race": cfg.race.model_copy(update={"probe_pairs": True})})
        extra["allowed_pairs"] = frozenset((a.nccl_id, p.nccl_id) for a in Algo for p in Proto)
    t = Tuning(table, cfg, NcclDefaults(feats), True, (1, 64), **extra)
    rng = random.Random(3)
    sc = scale_class(NRANKS, NNODES)
    cells = [(c, n.bit_length() - 1, n) for c in COLLS for n in SIZES]
    counter = dict.fromkeys(cells, 0)
    t.observe(sc, 4, 20, NRANKS, NNODES, (1, 1, 0, 0), 10.0)  # warm the caches
    t0 = time.process_time()
    for i in range(calls):
        if rounds and i and i % (64 * len(cells)) == 0:
            t.end_round()  # the proposer's, once per round
        cell = cells[i % len(cells)]
        ct = t.cells.get((sc, cell[0], cell[1]))
        j = counter[cell]
        counter[cell] = j + 1
        arm = ct.arms[ct.tuner.arm_for_call(j)] if ct is not None else (1, 1, 0, 0)
        base = 10.0 + cell[2] / 200 * (1 + 0.1 * arm[1]) * (1 + 0.01 * (arm[2] % 7))
        t.observe(sc, cell[0], cell[1], NRANKS, NNODES, arm, base * rng.lognormvariate(0, 0.03))
    return (time.process_time() - t0) / calls


def tuner_main(calls: int, repeats: int, compare: str | None, as_json: bool) -> None:
    """Best-of-`repeats` CPU per call of this checkout's tuner (and `compare`'s)."""
    trees = {"this": str(ROOT)} | ({"compare": compare} if compare else {})
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--tuner-run", str(calls)],
                env={**os.environ, "PYTHONPATH": tree, "SIDECAR_BENCH_TREE": tree},
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
            )
            us = float(out.stdout.strip().splitlines()[-1]) * 1e6
            best[name] = min(best.get(name, us), us)
    doc: dict[str, Any] = {"calls": calls, "repeats": repeats, "us_per_call": best}
    if compare:
        doc["compare_tree"] = compare
        doc["ratio_this_vs_compare"] = best["this"] / best["compare"]
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for name, us in best.items():
        print(f"{name:>8} ({trees[name]}): {us:.2f} us CPU per attributed call")
    if compare:
        print(f"ratio this / compare: {doc['ratio_this_vs_compare']:.3f}")


def report(rows: list[dict[str, Any]], as_json: bool, **extra: Any) -> bool:
    """The command, load average and rows as JSON (True: nothing more to print), or the
    header line of the text report."""
    doc = {
        "command": "benchmarks/sidecar_bench.py " + " ".join(sys.argv[1:]),
        **extra,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    if as_json:
        print(json.dumps(doc, indent=2))
        return True
    print(f"command: {doc['command']}  (load average {doc['load_average'][0]:.1f})")
    return False


def per_record_us(row: dict[str, Any]) -> float:
    """The sidecar's CPU microseconds per record read (its idle loop included)."""
    return float(row["cpu_core_fraction"] / max(row["records_per_s_read"], 1e-9) * 1e6)


def compare_main(a: argparse.Namespace, url: str) -> None:
    """This checkout's sidecar against `a.compare`'s, alternated, per rate (`--compare`)."""
    trees = {"this": str(ROOT), "compare": a.compare}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(a.repeats):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--run-one", a.rates,
                 str(a.duration), str(a.warmup), url],
                env={**os.environ, "PYTHONPATH": tree, "SIDECAR_BENCH_TREE": tree},
                cwd=tree, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[name].extend(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for rate in sorted({r["rate"] for r in runs["this"]}):
        best = {n: min(per_record_us(r) for r in runs[n] if r["rate"] == rate) for n in trees}
        every = {
            n: [round(per_record_us(r), 2) for r in runs[n] if r["rate"] == rate] for n in trees
        }
        rows.append({"rate": rate, "us_per_record": best, "runs": every,
                     "ratio_this_vs_compare": best["this"] / best["compare"]})  # fmt: skip
    if report(rows, a.json, compare_tree=a.compare):
        return
    for r in rows:
        b = r["us_per_record"]
        print(
            f"at {r['rate']:.0f}/s: this {b['this']:.2f} us, compare {b['compare']:.2f} us CPU "
            f"per record read (best of {a.repeats}; runs {r['runs']}); "
            f"ratio {r['ratio_this_vs_compare']:.3f}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--run-one":  # --compare: one tree's runs
        rates, duration, warmup, url = sys.argv[2:6]
        with tempfile.TemporaryDirectory() as tmp:
            got = [run(float(r), float(duration), float(warmup), Path(tmp), url)
                   for r in rates.split(",")]  # fmt: skip
        print(json.dumps(got))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--feed":
        feed(Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--tuner-run":
        from dynamiccl.agent import tuning  # noqa: PLC0415

        print(f"tuner code: {tuning.__file__}", file=sys.stderr)
        print(tuner_cpu(int(sys.argv[2])))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--rates", default="0,1000,10000")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--tuner", action="store_true", help="the online tuner's CPU per call only")
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare", help="another checkout's root, measured in the same run")
    # --compare without --tuner: the sidecar's CPU per record read, this tree's and TREE's
    a = p.parse_args()
    if a.tuner:
        tuner_main(a.calls, a.repeats, a.compare, a.json)
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/rewards"
    if a.compare:
        compare_main(a, url)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(r) for r in a.rates.split(",")):
            rows.append(run(rate, a.duration, a.warmup, Path(tmp), url))
    idle = next((r["cpu_core_fraction"] for r in rows if r["rate"] == 0), None)
    for r in rows:
        r["cpu_per_10k_per_s"] = (
            (r["cpu_core_fraction"] - (idle or 0.0)) * 10_000 / r["rate"] if r["rate"] else None
        )
        r["ratio_vs_idle"] = r["cpu_core_fraction"] / idle if idle else None
    if report(rows, a.json):
        return
    print(
        f"{'rate/s':>8} {'CPU (core)':>11} {'read/s':>9} {'fed':>8} {'dropped':>8} "
        f"{'acked':>8} {'vs idle':>8}"
    )
    for r in rows:
        vs = f"{r['ratio_vs_idle']:.1f}x" if r["ratio_vs_idle"] else "-"
        print(
            f"{r['rate']:>8.0f} {r['cpu_core_fraction']:>11.3f} {r['records_per_s_read']:>9.0f} "
            f"{r['fed']:>8} {r['ring_dropped']:>8} {r['acknowledged_calls']:>8.0f} {vs:>8}"
        )
    for r in rows:
        if r["cpu_per_10k_per_s"] is not None:
            print(
                f"at {r['rate']:.0f}/s: {r['cpu_per_10k_per_s']:.3f} cores per 10k collectives/s "
                "above the idle loop"
            )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Sidecar CPU per 10k collectives/s: `dynamiccl sidecar` draining a ring fed at a fixed rate.

    .venv/bin/python benchmarks/sidecar_bench.py                       # 0 (idle), 1k, 10k /s
    .venv/bin/python benchmarks/sidecar_bench.py --rates 10000 --duration 20 --json
    .venv/bin/python benchmarks/sidecar_bench.py --tuner --compare /tmp/old  # tuner only
    .venv/bin/python benchmarks/sidecar_bench.py --rates 10000 --compare /tmp/old --repeats 3

`--tuner`: the online tuner's own CPU per attributed call (`sidecar.tuning.Tuning.observe`,
the sidecar's configuration: a 16-call epoch per table round, each round 64 calls of
every cell (`Tuning.end_round` counted in), the bench's table of 24 tuned cells, NCCL's
picks from the job's features), each call taking the configuration the cell's plan draws
for the plugin's call counter, with lognormal 3 % times. Process CPU
time over `--calls` calls, best of `--repeats` runs, in a fresh interpreter per run.
With `--compare TREE` the same runs, interleaved, use the code of another checkout
(e.g. `git worktree add /tmp/old HEAD~1`), so both are measured in the same run.

One `dynamiccl sidecar` process (the real command, mode ``learned``: attribution,
aggregation, NCCL baseline, the online tuner per cell, the durable spool with
its per-pass state file, batches sent to a local HTTP endpoint that answers
200) runs on a shared-memory file whose profiler ring a feeder process fills
at `rate` records per second, exactly as the plugin does (body first, then the
sequence word; `head` claimed; a full ring drops and counts). The feeder
mixes 4 collectives x 6 sizes over one registered 8-rank communicator
(sidecar_workload.py: the job, its table and the feeder; sidecar_tuner.py: `--tuner`;
sidecar_compare.py: `--compare` without `--tuner`).

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
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SIDECAR_BENCH_TREE", str(ROOT)))  # --compare: another tree

from sidecar_compare import NoRecordsReadError, compare_rows, print_compare  # noqa: E402
from sidecar_tuner import tuner_cpu, tuner_main  # noqa: E402
from sidecar_workload import feed, register, write_config  # noqa: E402

from dynamiccl.sidecar import shm  # noqa: E402


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


def start_agent(cfg: Path, path: Path, url: str, token: Path, port: int) -> subprocess.Popen[str]:
    """The real `dynamiccl sidecar` on the file, sending to `url`; returns once it started."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl.cli", "sidecar", "--config-dir", str(cfg),
         "--shm", str(path), "--pod-name", "bench-0", "--pod-uid", "bench-uid",
         "--coordination", "none", "--ingest-url", url, "--token-file", str(token),
         "--metrics-port", str(port), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert agent.stdout is not None
    json.loads(agent.stdout.readline())  # started
    return agent


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
    agent = start_agent(cfg, path, url, token, port)
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
        metric(port, "dynamiccl_sidecar_ring_records_total"),
        time.monotonic(),
    )
    time.sleep(duration)
    c1, r1, t1 = (
        cpu_seconds(agent.pid),
        metric(port, "dynamiccl_sidecar_ring_records_total"),
        time.monotonic(),
    )
    if feeder is not None:
        feeder.wait(60)
    time.sleep(1.0)
    read_total = metric(port, "dynamiccl_sidecar_ring_records_total")
    acked = metric(port, "dynamiccl_sidecar_acknowledged_calls")
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
        from dynamiccl.sidecar import tuning  # noqa: PLC0415

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
        try:
            rows = compare_rows(a, url)
        except NoRecordsReadError as exc:
            sys.exit(f"sidecar_bench --compare: {exc}")
        if not report(rows, a.json, compare_tree=a.compare):
            print_compare(rows, a.repeats)
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
    print_rates(rows)


def print_rates(rows: list[dict[str, Any]]) -> None:
    """The text report of the per-rate runs."""
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

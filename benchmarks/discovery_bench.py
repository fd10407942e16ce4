#!/usr/bin/env python3
"""Node agent: discovery time and API writes per hour at steady state.

    .venv/bin/python benchmarks/discovery_bench.py                 # defaults below
    .venv/bin/python benchmarks/discovery_bench.py --runs 200 --rounds 100 --json

1. Discovery time on the DGX H100 fixture (tests/fixtures/hosts/dgx-h100;
   8 GPUs, 4 NVSwitches, 10 RDMA ports, recorded NVML answers), in-process,
   median / p90 over ``--runs`` runs after one warm-up. Target: < 200 ms.
   Baseline in the same run: reading every file of the fixture tree once
   (the raw I/O a discovery cannot avoid), so the ratio shows the cost of
   parsing, merging and validating on top of I/O. Also the end-to-end
   ``dynamiccl discover --json`` command (interpreter start + imports),
   median over ``--cli-runs``. On a real host, live NVML calls replace the
   recording; their cost is not measured here (no GPU on this machine).

2. API writes at steady state: ``--rounds`` agent rounds against an
   in-memory API at our adapter layer (objects round-tripped through JSON as
   the API server stores them) that counts every call. Round 1 publishes;
   the writes of rounds 2..N are extrapolated to one hour at ``--interval``
   seconds per round. The same zero-write claim is checked on a real
   kube-apiserver by tests/integration/node_agent/test_publish.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hosts" / "dgx-h100"

from dynamiccl.node_agent.agent_loop import AgentLoop  # noqa: E402
from dynamiccl.node_agent.discover import discover  # noqa: E402
from dynamiccl.node_agent.hostroot import HostRoot  # noqa: E402


class CountingApi:
    """In-memory TopologyApi: JSON round trip like the API server, every call counted."""

    def __init__(self, node: str) -> None:
        self.labels: dict[str, dict[str, str]] = {node: {"kubernetes.io/hostname": node}}
        self.objects: dict[str, dict[str, Any]] = {}
        self.reads = 0
        self.writes = 0

    def get_node_labels(self, name: str) -> dict[str, str] | None:
        self.reads += 1
        return dict(self.labels[name]) if name in self.labels else None

    def get_topology(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.objects.get(name))

    def create_topology(self, body: dict[str, Any]) -> None:
        self.writes += 1
        obj = json.loads(json.dumps(body))
        obj.pop("status", None)
        self.objects[body["metadata"]["name"]] = obj

    def replace_topology_status(self, name: str, status: dict[str, Any]) -> None:
        self.writes += 1
        self.objects[name]["status"] = json.loads(json.dumps(status))

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> None:
        self.writes += 1
        for k, v in labels.items():
            if v is None:
                self.labels[name].pop(k, None)
            else:
                self.labels[name][k] = v


def _ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 2),
        "p90_ms": round(s[int(0.9 * (len(s) - 1))] * 1000, 2),
        "min_ms": round(s[0] * 1000, 2),
    }


def bench_discovery(runs: int) -> dict[str, Any]:
    host = HostRoot(FIXTURE)
    discover(host)  # warm-up: imports, page cache
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        discover(host)
        times.append(time.perf_counter() - t0)
    files = [p for p in FIXTURE.rglob("*") if p.is_file()]
    raw = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for p in files:
            p.read_bytes()
        raw.append(time.perf_counter() - t0)
    out: dict[str, Any] = {
        "runs": runs,
        "discover": _ms(times),
        "read_all_files": _ms(raw),
        "files": len(files),
    }
    out["ratio_vs_raw_io"] = round(statistics.median(times) / statistics.median(raw), 1)
    out["target_ms"] = 200
    out["meets_target"] = out["discover"]["median_ms"] < 200
    return out


def bench_cli(runs: int) -> dict[str, Any]:
    cmd = [str(ROOT / ".venv" / "bin" / "dynamiccl"), "discover", "--root", str(FIXTURE), "--json"]
    if not Path(cmd[0]).exists():
        cmd = [sys.executable, "-m", "dynamiccl.cli", *cmd[1:]]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=os.environ.copy())
        times.append(time.perf_counter() - t0)
    return {"runs": runs, **_ms(times)}


def bench_writes(rounds: int, interval: float) -> dict[str, Any]:
    api = CountingApi("bench-node")
    loop = AgentLoop(api=api, host=HostRoot(FIXTURE), node_name="bench-node")
    loop.round()
    first_writes, first_reads = api.writes, api.reads
    for _ in range(rounds - 1):
        loop.round()
    steady_writes = api.writes - first_writes
    steady_reads = api.reads - first_reads
    per_hour = 3600.0 / interval
    return {
        "rounds": rounds,
        "interval_s": interval,
        "first_round_writes": first_writes,
        "steady_rounds": rounds - 1,
        "steady_writes": steady_writes,
        "writes_per_hour": round(steady_writes / (rounds - 1) * per_hour, 3),
        "reads_per_hour": round(steady_reads / (rounds - 1) * per_hour, 1),
        "note": f"extrapolated from {rounds - 1} steady rounds of an unchanged host",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--interval", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result: dict[str, Any] = {
        "fixture": str(FIXTURE.relative_to(ROOT)),
        "discovery": bench_discovery(args.runs),
        "cli": bench_cli(args.cli_runs),
        "steady_state": bench_writes(args.rounds, args.interval),
        "command": "python benchmarks/discovery_bench.py " + " ".join(sys.argv[1:]),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    d, c, w = result["discovery"], result["cli"], result["steady_state"]
    print(f"discovery on {result['fixture']} ({d['runs']} runs)")
    print(
        f"  discover():        median {d['discover']['median_ms']} ms, "
        f"p90 {d['discover']['p90_ms']} ms (target < 200 ms: {d['meets_target']})"
    )
    print(
        f"  baseline raw I/O:  median {d['read_all_files']['median_ms']} ms "
        f"for {d['files']} files -> discover is {d['ratio_vs_raw_io']}x raw I/O"
    )
    print(f"  CLI end to end:    median {c['median_ms']} ms ({c['runs']} runs, incl. startup)")
    print(f"steady state ({w['rounds']} rounds, one every {w['interval_s']} s)")
    print(f"  first round writes: {w['first_round_writes']}")
    print(f"  writes in {w['steady_rounds']} steady rounds: {w['steady_writes']}")
    print(
        f"  -> {w['writes_per_hour']} writes/hour, {w['reads_per_hour']} reads/hour ({w['note']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

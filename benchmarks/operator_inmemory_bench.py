"""Operator memory and handler latency against cluster size, and the webhook under one
2 000-pod burst: the product's own handler and webhook code on 2 cores (issue 33 item 4).

    .venv/bin/python benchmarks/operator_inmemory_bench.py [--curve 1250:500,2500:1000,...]
        [--burst 2000] [--connections 64] [--replicas 1]
    .venv/bin/python benchmarks/operator_inmemory_bench.py --burst-curve 64:1,128:1,256:1,256:2

The one stand-in: the apiserver is `dynamiccl.testing.memory_api.MemoryAPI` (the objects in
a table, the Events the handlers write kept apart from the objects), with an index of label
selectors (a pod list by job label costs what the apiserver's watch cache costs, not a scan
of every object here). It runs in a process of its own (``--stand-in process``, the
default): what it stores is not in the operator's memory, and its CPU is not the
operator's (the pickling of its calls' objects in the operator's process is counted apart,
``api s``, and left out of the operator's CPU per event). ``--stand-in inline`` runs it in
the operator's process, as before 2026-11-28's third session, for the comparison. Network,
TLS to the apiserver, etcd and the watches' latency are not measured here:
benchmarks/operator_scale_bench.py and benchmarks/webhook_bench.py measure them against a
real control plane.

Operator, per point of the curve (nodes, jobs), each in a fresh process:
- a node event and a NodeTopology event are what the operator's watch caches do with them
  (`ObjectCache.on_event` with the operator's shrink functions; no handler runs for nodes);
- a job event is `Reconciler.reconcile` (the kopf handler's body) of a tuned PyTorchJob with
  two pods bound to the bench's nodes: first its creation (decide, compile, ConfigMap,
  TuningRun, the sidecars' objects) of every job, then a pod binding (forced) and an
  unchanged update of a spread sample of `SAMPLE` jobs;
- RSS (VmRSS): after the watch caches are fed, less what the job objects (the inputs) took;
  kept: at the end, the inputs freed and the heap trimmed (what the operator holds: caches,
  fingerprints, compile caches); peak (VmHWM) less the inputs. Inline, the stand-in's
  objects are freed before "kept" is read, and the peak holds them (an upper bound).
Webhook: the operator's aiohttp server over HTTPS (`ServerThread`, the chart's answer budget)
receives one AdmissionReview per pod of a 2 000-pod job from ``--connections`` concurrent
keep-alive connections, all sent at once: with the job's ConfigMap in the webhook's cache
(its steady state), and cold (the cache empty: every pod takes the miss path, a GET of the
ConfigMap from the stand-in).

The stand-in and how its calls are counted: inmemory_api.py; the webhook's burst:
webhook_burst.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import scale_cluster as sc  # benchmarks/, this script's folder
from inmemory_api import NS, PYTORCHJOBS, CountingAPI, RemoteAPI, StandIn, counted, percentile
from webhook_burst import BURST_HEADER, burst_row, burst_run, print_burst

from dynamiccl import constants as c
from dynamiccl.api import topo_nodes
from dynamiccl.node_agent import topo_file
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.operator.controller import configmap, handlers
from dynamiccl.operator.controller.cache import (
    ObjectCache,
    shrink_config_map,
    shrink_node,
    shrink_node_topology,
)
from dynamiccl.operator.kube import CONFIGMAPS, NAMESPACES, PODS, NotFoundError
from dynamiccl.testing import builders

REPO = Path(__file__).resolve().parents[1]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
DEFAULT_CURVE = "1250:500,2500:1000,5000:2500,12500:5000"
SAMPLE = 200  # jobs of the pod-bound and unchanged passes (every job is created)


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs (at least two distinct xs)."""
    n = len(xs)
    if n != len(ys) or n < 2 or len(set(xs)) < 2:
        raise ValueError("a fit needs two or more distinct points")
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def parse_curve(text: str) -> list[tuple[int, int]]:
    """``"1250:500,2500:1000"`` -> [(1250, 500), (2500, 1000)] (nodes:jobs, both > 0)."""
    out = []
    for part in text.split(","):
        nodes, sep, jobs = part.strip().partition(":")
        if not sep or not nodes.isdigit() or not jobs.isdigit() or not int(nodes) or not int(jobs):
            raise ValueError(f"curve point {part!r}: want NODES:JOBS, both positive integers")
        out.append((int(nodes), int(jobs)))
    return out


def _mem() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


def _topologies() -> list[dict[str, Any]]:
    """NodeTopology statuses the node agent publishes for two real layouts (recorded hosts):
    AWS p5 (with a topology file in auto mode) and DGX H100 (none)."""
    out = []
    for layout in ("aws-p5", "dgx-h100"):
        topo = topo_file.with_file(
            discover(HostRoot(HOSTS / layout), name="x"), topo_file.Mode.AUTO
        )
        out.append(json.loads(json.dumps(topo.wire())))
    return out


def _timed_events(cache: ObjectCache, objs: Iterable[dict[str, Any]]) -> list[float]:
    out = []
    for obj in objs:
        t0 = time.process_time()
        cache.on_event("ADDED", obj)
        out.append(time.process_time() - t0)
    return out


def _reconcile_all(
    rec: handlers.Reconciler,
    api: StandIn,
    cms: ObjectCache,
    jobs: list[str],
    force: bool,
) -> dict[str, Any]:
    """One event per job (read from the stand-in, as its watch event would bring it: the
    jobs are not all held here) through the handler; the ConfigMap the handler wrote
    reaches the webhook's cache as its watch would deliver it. Latency: wall per event;
    CPU: the process's CPU less the stand-in's time."""
    lat, cpu = [], []
    calls0 = sum(api.calls.values())

    async def go() -> None:
        for job_name in jobs:
            job = api.stored(PYTORCHJOBS, job_name, NS)
            api_s0, t0, p0 = api.seconds, time.perf_counter(), time.process_time()
            await rec.reconcile(job, "PyTorchJob", force=force)
            lat.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - p0 - (api.seconds - api_s0))
            name = configmap.object_name(job["metadata"]["name"])
            if cms.get(NS, name) is None:
                with contextlib.suppress(NotFoundError):
                    cms.on_event("ADDED", api.stored(CONFIGMAPS, name, NS))

    asyncio.run(go())
    return {
        "p50_ms": 1e3 * percentile(lat, 0.5),
        "p99_ms": 1e3 * percentile(lat, 0.99),
        "max_ms": 1e3 * max(lat),
        "cpu_ms": 1e3 * sum(cpu) / len(cpu),
        "api_calls": (sum(api.calls.values()) - calls0) / len(jobs),
    }


def _inputs(
    api: StandIn, nodes: int, jobs: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The point's nodes, NodeTopologies and tuned jobs' names (two pods each, bound), the
    jobs and pods added to the stand-in."""
    statuses = _topologies()
    node_objs = [sc.node(i) for i in range(nodes)]
    topo_objs = [
        {"metadata": {"name": n["metadata"]["name"]}, "status": statuses[i % 2]}
        for i, n in enumerate(node_objs)
    ]
    job_names = []
    for i in range(jobs):
        job = builders.pytorchjob(
            f"job-{i:05d}",
            namespace=NS,
            uid=f"uid-{i}",
            annotations={c.ANNOTATION_TUNE: "true", c.ANNOTATION_PARALLELISM: "fsdp"},
            nproc_per_node="8",
        )
        api.add(PYTORCHJOBS, job)
        for k, role in enumerate(("Master", "Worker")):
            pod = sc.pod(job, role, node_objs[(2 * i + k) % nodes]["metadata"]["name"])
            pod["metadata"]["namespace"] = NS
            api.add(PODS, pod)
        job_names.append(job["metadata"]["name"])
    return node_objs, topo_objs, job_names


def _point(nodes: int, jobs: int, remote: bool = True) -> dict[str, Any]:
    """One curve point in this process (see the module docstring)."""
    api: StandIn = RemoteAPI() if remote else CountingAPI()  # forked before any thread
    configmap.warm_up()
    rss0, _ = _mem()
    api.add(NAMESPACES, {"metadata": {"name": NS, "labels": {}}})
    policy = {"metadata": {"name": "all", "uid": "p"}, "spec": {}}
    api.add(handlers.POLICIES, policy)
    node_objs, topo_objs, job_objs = _inputs(api, nodes, jobs)  # job names
    rss_inputs, _ = _mem()
    counted(api)
    policies, node_cache = ObjectCache(), ObjectCache(shrink_node)
    topo_cache, cms = ObjectCache(shrink_node_topology), ObjectCache(shrink_config_map)
    policies.on_event("ADDED", policy)
    node_cpu = _timed_events(node_cache, node_objs)
    topo_cpu = _timed_events(topo_cache, topo_objs)
    del node_objs, topo_objs
    rss_caches, _ = _mem()
    rec = handlers.Reconciler(api, cms, policies, node_cache, topo_cache)  # type: ignore[arg-type]
    created = _reconcile_all(rec, api, cms, job_objs, force=False)
    sample = job_objs[:: max(1, jobs // SAMPLE)]  # the later passes: a spread sample
    bound = _reconcile_all(rec, api, cms, sample, force=True)
    unchanged = _reconcile_all(rec, api, cms, sample, force=False)
    rss_end, hwm = _mem()
    inputs = rss_inputs - rss0
    cm = api.stored(CONFIGMAPS, configmap.object_name(job_objs[-1]), NS)
    listed = topo_nodes.of_config_map(cm)
    cm_bytes = len(json.dumps(cm).encode())
    # What the operator keeps: its caches, fingerprints and compile caches. The inputs (and,
    # inline, the stand-in's objects: every full ConfigMap the handler wrote) are freed
    # and handed back to the kernel.
    if isinstance(api, RemoteAPI):
        stand_in_mib = api.rss_mib()
        api.close()
    else:
        stand_in_mib = rss_end - rss_inputs
        api.objs.clear()
        api.by_label.clear()
    del job_objs, sample, cm
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_kept, _ = _mem()
    return {
        "nodes": nodes,
        "jobs": jobs,
        "rss_base_mib": rss0,
        "rss_caches_mib": rss_caches - inputs,
        "rss_steady_mib": rss_kept,
        "rss_peak_mib": hwm - inputs,  # inline: an upper bound (the stand-in's writes)
        "inputs_mib": inputs,
        "stand_in": "process" if remote else "inline",
        "stand_in_mib": stand_in_mib,  # its process's RSS; inline: what it grew here
        "node_event_us": 1e6 * percentile(node_cpu, 0.5),
        "topology_event_us": 1e6 * percentile(topo_cpu, 0.5),
        "job_created": created,
        "pod_bound": bound,
        "unchanged": unchanged,
        "tuned": len(cms),
        "config_map_bytes": cm_bytes,
        "nodes_with_file": sum(1 for t in topo_cache.values() if t["status"].get("ncclTopoFile")),
        "nodes_file_listed": len(listed),
        "api_seconds": api.seconds,
    }


def _child(args: list[str]) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if res.returncode:
        raise RuntimeError(f"{args}: exit {res.returncode}\n{res.stderr[-3000:]}")
    parsed: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return parsed


def _header() -> None:
    print(
        "| nodes | jobs | RSS caches MiB | RSS kept / peak (bound) MiB | node / topology event us "
        "| job created p50 / p99 / max ms | its CPU ms | API calls | pod bound p50 / p99 ms "
        "| unchanged p50 us | job ConfigMap B | nodes with a file / listed | stand-in MiB |"
    )
    print("|" + "---:|" * 13)


def _row(p: dict[str, Any]) -> None:
    cr, bd, un = p["job_created"], p["pod_bound"], p["unchanged"]
    print(
        f"| {p['nodes']} | {p['jobs']} | {p['rss_caches_mib']:.0f} "
        f"| {p['rss_steady_mib']:.0f} / {p['rss_peak_mib']:.0f} "
        f"| {p['node_event_us']:.0f} / {p['topology_event_us']:.0f} "
        f"| {cr['p50_ms']:.1f} / {cr['p99_ms']:.1f} / {cr['max_ms']:.0f} | {cr['cpu_ms']:.1f} "
        f"| {cr['api_calls']:.1f} | {bd['p50_ms']:.1f} / {bd['p99_ms']:.1f} "
        f"| {1e3 * un['p50_ms']:.0f} | {p['config_map_bytes']} "
        f"| {p['nodes_with_file']} / {p['nodes_file_listed']} "
        f"| {p['stand_in_mib']:.0f} ({p['stand_in']}) |",
        flush=True,
    )


def extrapolate(points: list[dict[str, Any]], target: tuple[int, int]) -> dict[str, float]:
    """Linear fits to ``target`` (nodes, jobs): RSS after the caches in nodes, plus what the
    jobs add above it (kept, peak) in jobs; CPU per job created in nodes."""
    nodes = [float(p["nodes"]) for p in points]
    jobs = [float(p["jobs"]) for p in points]
    a, b = linear_fit(nodes, [p["rss_caches_mib"] for p in points])
    caches = a + b * target[0]
    out = {"RSS after the caches MiB": caches}
    for label, key in (("RSS kept MiB", "rss_steady_mib"), ("RSS peak MiB", "rss_peak_mib")):
        a, b = linear_fit(jobs, [p[key] - p["rss_caches_mib"] for p in points])
        out[label] = caches + a + b * target[1]
        out[label.replace("MiB", "KiB per job")] = 1024 * b
    a, b = linear_fit(nodes, [p["job_created"]["cpu_ms"] for p in points])
    out["job created CPU ms"] = a + b * target[0]
    return out


def _print_extrapolation(points: list[dict[str, Any]], target: tuple[int, int]) -> None:
    if len({p["nodes"] for p in points}) < 2 or len({p["jobs"] for p in points}) < 2:
        return
    for label, value in extrapolate(points, target).items():
        print(f"EXTRAPOLATED to {target[0]} nodes / {target[1]} jobs: {label} {value:.0f}")


def _burst_curve(pods: int, points: list[tuple[int, int]], rounds: int, out: Path | None) -> None:
    """The burst at each (connections, replicas), the points in turn for each round."""
    print(f"webhook, one job of {pods} pods created at once; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(BURST_HEADER)
    runs = []
    for _ in range(rounds):
        for conns, replicas in points:
            args = ["--burst-only", "--burst", str(pods), "--connections", str(conns)]
            runs.append(_child([*args, "--replicas", str(replicas)]) | {"connections": conns})
            for phase in ("cached", "cold"):
                print(burst_row(runs[-1], phase, conns), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if out:
        out.write_text(json.dumps(runs, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--curve", default=DEFAULT_CURVE, help="NODES:JOBS,... (each a fresh process)")
    ap.add_argument("--burst", type=int, default=2000, help="pods of the webhook's one job")
    ap.add_argument("--connections", type=int, default=64, help="concurrent webhook connections")
    ap.add_argument("--replicas", type=int, default=1, help="operator replicas serving the webhook")
    ap.add_argument(
        "--burst-curve",
        metavar="CONNS:REPLICAS,...",
        help="the webhook's burst alone at each point, --rounds times in turn (fresh processes)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --burst-curve")
    ap.add_argument(
        "--stand-in",
        choices=("process", "inline"),
        default="process",
        help="where the stand-in apiserver runs (inline: in the operator's process)",
    )
    ap.add_argument("--point", help=argparse.SUPPRESS)
    ap.add_argument("--burst-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args(argv)
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    if a.point:
        ((nodes, jobs),) = parse_curve(a.point)
        print(json.dumps(_point(nodes, jobs, a.stand_in == "process")))
        return
    if a.burst_only:
        print(json.dumps(burst_run(a.burst, a.connections, a.replicas)))
        return
    if a.burst_curve:
        _burst_curve(a.burst, parse_curve(a.burst_curve), a.rounds, a.json)
        return
    curve = parse_curve(a.curve)
    t0 = time.monotonic()
    _header()
    points = []
    for n, j in curve:
        points.append(_child(["--point", f"{n}:{j}", "--stand-in", a.stand_in]))
        _row(points[-1])
    _print_extrapolation(points, (12500, 5000))
    burst = _child(
        ["--burst-only", "--burst", str(a.burst), "--connections", str(a.connections),
         "--replicas", str(a.replicas)]
    )  # fmt: skip
    print_burst(burst, a.burst, a.connections)
    print(f"(whole run {time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})")
    if a.json:
        a.json.write_text(json.dumps({"points": points, "burst": burst}, indent=1))


if __name__ == "__main__":
    main()

"""The webhook under one job's pods created at once (benchmarks/operator_inmemory_bench.py).

The operator's aiohttp server over HTTPS (`ServerThread`, the chart's answer budget)
receives one AdmissionReview per pod of a ``pods``-pod job from ``conns`` concurrent
keep-alive connections, all sent at once, from a process of its own: with the job's
ConfigMap in the webhook's cache (its steady state), and cold (the cache empty: every
pod takes the miss path, a GET of the ConfigMap from the stand-in, inmemory_api.py).

``replicas``: every operator replica serves the webhook (charts/dynamiccl
`operator.replicas`), each with its own ConfigMap cache and GIL; the Service spreads the
apiserver's connections over them. Each replica here is a process of its own with the
operator's start-up settings (`run.SWITCH_INTERVAL`, `run.THREADS`) and its own copy of
the stand-in, and the connections go to them in turn.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import multiprocessing
import ssl
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import scale_cluster as sc  # benchmarks/, this script's folder
from inmemory_api import NS, PYTORCHJOBS, CountingAPI, counted, percentile

from dynamiccl import constants as c
from dynamiccl.operator import run as operator_run
from dynamiccl.operator.controller import configmap, handlers
from dynamiccl.operator.controller.cache import ObjectCache, shrink_config_map, shrink_node
from dynamiccl.operator.kube import CONFIGMAPS, NAMESPACES
from dynamiccl.operator.webhook import certs, server
from dynamiccl.testing import builders
from dynamiccl.testing.memory_api import MemoryAPI


def _review(pod: dict[str, Any], i: int) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"r-{i}",
                "operation": "CREATE",
                "namespace": NS,
                "object": pod,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
            },
        }
    ).encode()


def _send_all(
    conn: Connection, ports: list[int], ca: bytes, bodies: list[bytes], conns: int
) -> None:
    """Every body POSTed at once over ``conns`` keep-alive HTTPS connections to ``ports`` in
    turn: connected first (then "connected" on ``conn``), sent when told; each answer's
    latency from its own send, the last one's from the burst's start. A process of its own
    (the apiserver's side: not the webhook's GIL)."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False  # the certificate names localhost; we dial 127.0.0.1
    per = [bodies[k::conns] for k in range(conns)]
    lat: list[float] = []
    waited: list[float] = []
    patched = [0]
    lock = threading.Lock()
    clients = []
    for k in range(len(per)):
        h = http.client.HTTPSConnection("127.0.0.1", ports[k % len(ports)], context=ctx, timeout=30)
        h.connect()
        clients.append(h)
    go = threading.Event()
    start = [0.0]

    def worker(k: int) -> None:
        go.wait()
        for body in per[k]:
            t0 = time.perf_counter()
            clients[k].request("POST", "/mutate", body, {"Content-Type": "application/json"})
            answer = json.loads(clients[k].getresponse().read())["response"]
            t1 = time.perf_counter()
            with lock:
                lat.append(t1 - t0)
                waited.append(t1 - start[0])
                patched[0] += bool(answer.get("patch") and base64.b64decode(answer["patch"]))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    conn.send("connected")
    conn.recv()
    cpu0 = time.process_time()
    start[0] = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start[0]
    cpu = time.process_time() - cpu0
    for h in clients:
        h.close()
    conn.send({
        "pods": len(bodies),
        "mutated": patched[0],
        "p50_ms": 1e3 * percentile(lat, 0.5),
        "p99_ms": 1e3 * percentile(lat, 0.99),
        "max_ms": 1e3 * max(lat),
        "last_answer_s": max(waited),
        "pods_per_s": len(bodies) / wall,
        "client_cpu_ms_per_pod": 1e3 * cpu / len(bodies),
    })  # fmt: skip


def _replica(conn: Connection, cm: dict[str, Any] | None, objs: Any, bundle: certs.Bundle) -> None:
    """One operator replica's webhook (module docstring): its port, then its CPU from "mark"
    to "stop" and the stand-in's calls."""
    sys.setswitchinterval(operator_run.SWITCH_INTERVAL)
    api = CountingAPI()
    api.objs = objs
    counted(api)
    cms = ObjectCache(shrink_config_map)
    if cm is not None:
        cms.on_event("ADDED", cm)
    admission = server.Admission(
        cms,
        "example.invalid/dynamiccl:1",
        "",
        operator_run.miss_lookup(api, cms),  # type: ignore[arg-type]
    )
    srv = server.ServerThread(
        server.app(admission), "127.0.0.1", 0, _server_ctx(bundle), operator_run.THREADS
    )
    srv.start()
    conn.send(srv.port)
    conn.recv()  # the client has connected: its TLS handshakes are not the burst's
    cpu0 = time.process_time()
    conn.recv()
    cpu = time.process_time() - cpu0
    srv.stop()
    conn.send({"cpu_s": cpu, "api_calls": sum(api.calls.values())})


def _job(pods: int) -> tuple[dict[Any, Any], dict[str, Any], dict[str, Any], float, int]:
    """The stand-in's objects once the job is reconciled (each replica's copy starts from
    them); the job, its ConfigMap, the reconcile's seconds and objects created."""
    configmap.warm_up()
    api = CountingAPI()
    api.add(NAMESPACES, {"metadata": {"name": NS, "labels": {}}})
    policy = {"metadata": {"name": "all", "uid": "p"}, "spec": {}}
    api.add(handlers.POLICIES, policy)
    job = builders.pytorchjob(
        "big",
        namespace=NS,
        uid="uid-big",
        annotations={c.ANNOTATION_TUNE: "true"},
        workers=pods - 1,
    )
    api.add(PYTORCHJOBS, job)
    policies = ObjectCache()
    policies.on_event("ADDED", policy)
    node_cache = ObjectCache(shrink_node)
    for i in range(64):  # the cluster the job's features come from (its pods are not bound)
        node_cache.on_event("ADDED", sc.node(i))
    cms = ObjectCache(shrink_config_map)
    rec = handlers.Reconciler(api, cms, policies, node_cache, ObjectCache())  # type: ignore[arg-type]
    counted(api)
    t0 = time.perf_counter()
    asyncio.run(rec.reconcile(job, "PyTorchJob"))
    reconcile_s, writes = time.perf_counter() - t0, api.calls.get("create", 0)
    cm = MemoryAPI.get(api, CONFIGMAPS, configmap.object_name("big"), NS)
    return dict(api.objs), job, cm, reconcile_s, writes


def _answer(conn: Connection, timeout_s: float = 120.0) -> Any:
    """A child's next message; an error if it sends none in time (it died: see its stderr)."""
    if not conn.poll(timeout_s):
        raise RuntimeError(f"a burst process sent nothing in {timeout_s:.0f} s")
    return conn.recv()


def burst_run(pods: int, conns: int, replicas: int = 1) -> dict[str, Any]:
    """The webhook's answers to one job's ``pods`` pods created at once (module docstring)."""
    objs, job, cm, reconcile_s, writes = _job(pods)
    bodies = [_review(builders.pod_of(job, i - 1), i) for i in range(1, pods)]
    bodies.append(_review(builders.pod_of(job, 0, replica="Master"), 0))
    bundle = certs.issue(["localhost"])
    spawn = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {"reconcile_s": reconcile_s, "creates": writes, "replicas": replicas}
    for phase in ("cached", "cold"):
        pipes, procs = [], []
        for _ in range(replicas):
            mine, theirs = spawn.Pipe()
            cached = cm if phase == "cached" else None
            procs.append(spawn.Process(target=_replica, args=(theirs, cached, objs, bundle)))
            procs[-1].start()
            pipes.append(mine)
        ports = [_answer(p) for p in pipes]
        mine, theirs = spawn.Pipe()
        procs.append(
            spawn.Process(target=_send_all, args=(theirs, ports, bundle.ca_crt, bodies, conns))
        )
        procs[-1].start()
        try:
            _answer(mine)  # connected
            for p in pipes:
                p.send("mark")
            mine.send("go")
            out[phase] = _answer(mine)
        finally:
            for p in pipes:
                p.send("stop")
            done = [_answer(p) for p in pipes]
            for proc in procs:
                proc.join()
        out[phase]["cpu_ms_per_pod"] = 1e3 * sum(d["cpu_s"] for d in done) / pods
        out[phase]["api_calls_per_pod"] = sum(d["api_calls"] for d in done) / pods
    return out


def _server_ctx(bundle: certs.Bundle) -> ssl.SSLContext:
    from dynamiccl.operator.webhook import serving_tls  # noqa: PLC0415

    return serving_tls.load_into(bundle)


def print_burst(burst: dict[str, Any], pods: int, conns: int) -> None:
    """The text report of `burst_run`."""
    print(
        f"\nwebhook, one job of {pods} pods created at once, {conns} connections, "
        f"{burst['replicas']} replica(s) (its reconcile {burst['reconcile_s']:.2f} s, "
        f"{burst['creates']} objects created; answer budget {server.ANSWER_BUDGET_S} s):"
    )
    print(BURST_HEADER)
    for phase in ("cached", "cold"):
        print(burst_row(burst, phase, conns))


BURST_HEADER = (
    "| in flight | replicas | webhook cache | mutated | p50 / p99 / max ms | last answer s "
    "| pods/s | webhook CPU ms/pod | client CPU ms/pod | API calls/pod |\n"
    "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
)


def burst_row(burst: dict[str, Any], phase: str, conns: int) -> str:
    b = burst[phase]
    return (
        f"| {conns} | {burst['replicas']} | {phase} | {b['mutated']} / {b['pods']} "
        f"| {b['p50_ms']:.1f} / {b['p99_ms']:.1f} / {b['max_ms']:.0f} "
        f"| {b['last_answer_s']:.2f} | {b['pods_per_s']:.0f} | {b['cpu_ms_per_pod']:.2f} "
        f"| {b['client_cpu_ms_per_pod']:.2f} | {b['api_calls_per_pod']:.3f} |"
    )

"""The webhook under one job's pods created at once (benchmarks/operator_inmemory_bench.py).

The operator's aiohttp server over HTTPS (`ServerThread`, the chart's answer budget)
receives one AdmissionReview per pod of a ``pods``-pod job from ``conns`` concurrent
keep-alive connections, all sent at once, from a process of its own: with the job's
ConfigMap in the webhook's cache (its steady state), and cold (the cache empty: every
pod takes the miss path, a GET of the ConfigMap from the stand-in, inmemory_api.py).
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import multiprocessing
import ssl
import threading
import time
from concurrent.futures import ProcessPoolExecutor
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


def _send_all(port: int, ca: bytes, bodies: list[bytes], conns: int) -> dict[str, Any]:
    """Every body POSTed at once over ``conns`` keep-alive HTTPS connections (connected
    first); each answer's latency from its own send, and the last one's from the burst's
    start. Runs in a process of its own (the apiserver's side: not the webhook's GIL)."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False  # the certificate names localhost; we dial 127.0.0.1
    per = [bodies[k::conns] for k in range(conns)]
    lat: list[float] = []
    waited: list[float] = []
    patched = [0]
    lock = threading.Lock()
    clients = []
    for _ in per:
        h = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
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
    start[0] = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start[0]
    for h in clients:
        h.close()
    return {
        "pods": len(bodies),
        "mutated": patched[0],
        "p50_ms": 1e3 * percentile(lat, 0.5),
        "p99_ms": 1e3 * percentile(lat, 0.99),
        "max_ms": 1e3 * max(lat),
        "last_answer_s": max(waited),
        "pods_per_s": len(bodies) / wall,
    }


def burst_run(pods: int, conns: int) -> dict[str, Any]:
    """The webhook's answers to one job's ``pods`` pods created at once (module docstring)."""
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
    policies, cms = ObjectCache(), ObjectCache(shrink_config_map)
    policies.on_event("ADDED", policy)
    node_cache = ObjectCache(shrink_node)
    for i in range(64):  # the cluster the job's features come from (its pods are not bound)
        node_cache.on_event("ADDED", sc.node(i))
    rec = handlers.Reconciler(api, cms, policies, node_cache, ObjectCache())  # type: ignore[arg-type]
    counted(api)
    t0 = time.perf_counter()
    asyncio.run(rec.reconcile(job, "PyTorchJob"))
    reconcile_s, writes = time.perf_counter() - t0, api.calls.get("create", 0)
    cm = MemoryAPI.get(api, CONFIGMAPS, configmap.object_name("big"), NS)
    bodies = [_review(builders.pod_of(job, i - 1), i) for i in range(1, pods)]
    bodies.append(_review(builders.pod_of(job, 0, replica="Master"), 0))
    bundle = certs.issue(["localhost"])
    client = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    client.submit(time.sleep, 0).result()  # started before the clock runs
    out: dict[str, Any] = {"reconcile_s": reconcile_s, "creates": writes}
    for phase in ("cached", "cold"):
        hook_cms = ObjectCache(shrink_config_map)
        if phase == "cached":
            hook_cms.on_event("ADDED", cm)
        admission = server.Admission(
            hook_cms,
            "example.invalid/dynamiccl:1",
            "",
            operator_run.miss_lookup(api, hook_cms),  # type: ignore[arg-type]
        )
        srv = server.ServerThread(
            server.app(admission), "127.0.0.1", 0, _server_ctx(bundle), operator_run.THREADS
        )
        srv.start()
        calls0 = sum(api.calls.values())
        cpu0 = time.process_time()
        try:
            out[phase] = client.submit(_send_all, srv.port, bundle.ca_crt, bodies, conns).result()
        finally:
            srv.stop()
        out[phase]["cpu_ms_per_pod"] = 1e3 * (time.process_time() - cpu0) / pods
        out[phase]["api_calls_per_pod"] = (sum(api.calls.values()) - calls0) / pods
    client.shutdown()
    return out


def _server_ctx(bundle: certs.Bundle) -> ssl.SSLContext:
    from dynamiccl.operator.webhook import serving_tls  # noqa: PLC0415

    return serving_tls.load_into(bundle)


def print_burst(burst: dict[str, Any], pods: int, conns: int) -> None:
    """The text report of `burst_run`."""
    print(
        f"\nwebhook, one job of {pods} pods created at once, {conns} connections "
        f"(its reconcile {burst['reconcile_s']:.2f} s, {burst['creates']} objects created; "
        f"answer budget {server.ANSWER_BUDGET_S} s):"
    )
    print(
        "| webhook cache | mutated | p50 / p99 / max ms | last answer s | pods/s | CPU ms/pod "
        "| API calls/pod |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for phase in ("cached", "cold"):
        b = burst[phase]
        print(
            f"| {phase} | {b['mutated']} / {b['pods']} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} / "
            f"{b['max_ms']:.0f} | {b['last_answer_s']:.2f} | {b['pods_per_s']:.0f} "
            f"| {b['cpu_ms_per_pod']:.2f} | {b['api_calls_per_pod']:.2f} |"
        )

"""Webhook latency at a steady pod-creation rate, against the real kube-apiserver.

    .venv/bin/python benchmarks/webhook_bench.py [--rate 50] [--pods 300] [--kubeconfig PATH]

Starts ``dynamiccl operator --no-handlers`` as a local process, registers it with
a MutatingWebhookConfiguration (``clientConfig.url: https://127.0.0.1:<port>/mutate``),
creates a job ConfigMap, then runs three phases at ``--rate`` per second, each
``--pods`` requests, in this order:

1. ``baseline``: pod CREATEs the webhook does not select (objectSelector) — the
   apiserver's own latency on this machine right now;
2. ``webhook``: pod CREATEs of the tuned job — every one is sent to the webhook
   and mutated (sidecar, volumes, env);
3. ``direct``: the same AdmissionReview POSTed straight to the webhook over one
   keep-alive HTTPS connection (what the apiserver does), no apiserver involved;
4. ``direct+pods``: ``direct`` while pods the webhook does not select are created
   at the same rate (with ``--handlers`` the operator's kopf handlers, running as
   deployed, see every one of their events).

For each phase: client-side latency p50/p99; the operator's own per-request
time (``dynamiccl_webhook_duration_seconds``, bucket upper bounds); admission
requests and TLS handshakes the operator saw; the operator process's CPU time
per request; the machine's load average. The difference between the phases
says where the time goes: the handler, the HTTP/TLS server, or the apiserver
(its webhook call, re-invocation, the bigger mutated object) and CPU
contention. Target (issue #4): webhook p99 <= 10 ms at 50 pod creations/s.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dynamiccl import constants as c
from dynamiccl.testing import builders
from dynamiccl.testing.ports import free_port

CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
TICKS = os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("dynamiccl_webhook") and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _apiserver_webhook(api: Any, hook: str) -> dict[str, float]:
    """The apiserver's own histogram of calls to our webhook (its view of our latency)."""
    resp = api.call_api("GET", api.configuration.host + "/metrics")
    resp.read()
    out: dict[str, float] = {}
    for line in resp.data.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds") and (
            f'name="{hook}"' in line
        ):
            key, value = line.rsplit(" ", 1)
            le = key.split('le="')[1].split('"')[0] if 'le="' in key else None
            name = "bucket:" + le if le else key.split("{")[0].rsplit("_", 1)[1]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _hist_quantile(d: dict[str, float], q: float) -> float:
    buckets = []
    for key, count in d.items():
        if key.startswith("dynamiccl_webhook_duration_seconds_bucket"):
            le = key.split('le="')[1].split('"')[0]
        elif key.startswith("bucket:"):
            le = key[len("bucket:") :]
        else:
            continue
        buckets.append((float("inf") if le == "+Inf" else float(le), count))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("nan")


def _at_rate(n: int, rate: float, one: Callable[[int], None]) -> list[float]:
    """Run ``one(i)`` n times at ``rate``/s (a thread each); per-call latencies."""
    lat: list[float] = []
    lock = threading.Lock()

    def timed(i: int) -> None:
        t0 = time.perf_counter()
        one(i)
        with lock:
            lat.append(time.perf_counter() - t0)

    threads = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=timed, args=(i,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return lat


def _beside(measured: Callable[[], list[float]], load: Callable[[], object]) -> list[float]:
    """Run ``load`` in a thread while ``measured`` runs; the measured latencies."""
    th = threading.Thread(target=load)
    th.start()
    try:
        return measured()
    finally:
        th.join()


def _pod(name: str, job: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {c.LABEL_KUBEFLOW_JOB_NAME: job}},
        "spec": {"containers": [{"name": "t", "image": "example.invalid/t:1"}]},
    }


def _review(ns: str, i: int) -> bytes:
    pod = _pod(f"direct-{i}", "tuned")
    pod["metadata"]["namespace"] = ns
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": ns,
                "object": pod,
            },
        }
    ).encode()


class _Direct:
    """Keep-alive HTTPS connections to the webhook, one per concurrent caller."""

    def __init__(self, port: int, ca: bytes) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cadata=ca.decode())
        self.free: list[http.client.HTTPSConnection] = []
        self.lock = threading.Lock()

    def post(self, body: bytes) -> None:
        with self.lock:
            conn = self.free.pop() if self.free else None
        if conn is None:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx)
        conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert json.loads(resp.read())["response"]["patch"]
        with self.lock:
            self.free.append(conn)


def _mwc(name: str, ns: str, port: int) -> dict[str, Any]:
    # unique webhook name: the apiserver's metrics name it
    return builders.pod_webhook(
        name, port=port, namespace=ns, webhook=f"{ns}.bench.dynamiccl.io", job_names=["tuned"]
    )


def _phase(
    name: str,
    proc: subprocess.Popen[bytes],
    mport: int,
    apiserver: Callable[[], dict[str, float]],
    run: Callable[[], list[float]],
) -> dict[str, Any]:
    before, cpu0, load0 = _scrape(mport), _cpu_seconds(proc.pid), os.getloadavg()[0]
    seen0 = apiserver()
    lat = run()
    d = _delta(_scrape(mport), before)
    seen = _delta(apiserver(), seen0)
    calls = seen.get("count", 0.0)
    requests = d.get("dynamiccl_webhook_duration_seconds_count", 0.0)
    cpu = _cpu_seconds(proc.pid) - cpu0
    return {
        "phase": name,
        "p50_ms": round(_pct(lat, 0.5) * 1e3, 2),
        "p99_ms": round(_pct(lat, 0.99) * 1e3, 2),
        "max_ms": round(max(lat) * 1e3, 2),
        "admission_requests": requests,
        "mutated": d.get('dynamiccl_webhook_requests_total{result="mutated"}', 0.0),
        "tls_handshakes": d.get("dynamiccl_webhook_tls_handshakes_total", 0.0),
        "server_p50_le_ms": _hist_quantile(d, 0.5) * 1e3 if requests else None,
        "server_p99_le_ms": _hist_quantile(d, 0.99) * 1e3 if requests else None,
        "operator_cpu_ms_per_request": round(cpu * 1e3 / requests, 2) if requests else None,
        # The apiserver's histogram of its calls to our webhook (its buckets: 5, 25, 100 ms...).
        "apiserver_webhook_calls": calls,
        "apiserver_webhook_mean_ms": round(seen["sum"] / calls * 1e3, 2) if calls else None,
        "apiserver_webhook_p50_le_ms": _hist_quantile(seen, 0.5) * 1e3 if calls else None,
        "apiserver_webhook_p99_le_ms": _hist_quantile(seen, 0.99) * 1e3 if calls else None,
        "loadavg_1m": round((load0 + os.getloadavg()[0]) / 2, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument(
        "--handlers",
        action="store_true",
        help="run the kopf handlers too (as deployed): they see every pod event of the run",
    )
    ap.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG") or str(CACHE / "cluster/kubeconfig")
    )
    args = ap.parse_args()
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
    # One pooled TLS connection per concurrent request (no re-handshakes), and raw
    # responses: the Python client's model deserialisation would make this harness
    # the machine's biggest CPU consumer (it runs beside the apiserver and the webhook).
    cfg.connection_pool_maxsize = 128
    api = k8s.ApiClient(cfg)
    core, adm = k8s.CoreV1Api(api), k8s.AdmissionregistrationV1Api(api)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    port, mport = free_port(), free_port()
    mwc = f"dynamiccl-bench-{ns}"
    adm.create_mutating_webhook_configuration(_mwc(mwc, ns, port))  # type: ignore[arg-type]  # the client takes dict bodies
    mode = [f"--watch-namespace={ns}"] if args.handlers else ["--no-handlers"]
    # fmt: off
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl.cli", "operator", *mode,
         f"--kubeconfig={args.kubeconfig}", f"--namespace={ns}", "--webhook-host=127.0.0.1",
         f"--webhook-port={port}", f"--metrics-port={mport}", f"--webhook-config={mwc}",
         "--extra-san=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    # fmt: on
    try:
        secret = None
        for _ in range(600):
            try:
                secret = core.read_namespaced_secret("dynamiccl-webhook-tls", ns)
                ca = base64.b64decode((secret.data or {})["ca.crt"]).decode()
                ctx = ssl.create_default_context(cadata=ca)
                urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2)
                break
            except Exception:
                time.sleep(0.2)
        assert secret is not None, "operator never became ready"
        core.create_namespaced_config_map(
            ns,
            {  # type: ignore[arg-type]  # the client takes dict bodies
                "metadata": {
                    "name": "tuned-dynamiccl",
                    "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "job-config"},
                },
                "data": {"env.json": "{}"},
            },
        )
        time.sleep(1.5)  # the watch cache has it

        def create(job: str) -> Callable[[int], None]:
            def one(i: int) -> None:
                r = core.create_namespaced_pod(ns, _pod(f"{job}-{i}", job), _preload_content=False)  # type: ignore[arg-type]  # the client takes dict bodies
                r.read()  # type: ignore[attr-defined]  # _preload_content=False: the raw response

            return one

        hook = f"{ns}.bench.dynamiccl.io"

        def seen() -> dict[str, float]:
            return _apiserver_webhook(api, hook)

        assert secret.data is not None
        direct = _Direct(port, base64.b64decode(secret.data["ca.crt"]))
        n, rate = args.pods, args.rate
        phases = [
            _phase("baseline", proc, mport, seen, lambda: _at_rate(n, rate, create("plain"))),
            _phase("webhook", proc, mport, seen, lambda: _at_rate(n, rate, create("tuned"))),
            _phase(
                "direct",
                proc,
                mport,
                seen,
                lambda: _at_rate(n, rate, lambda i: direct.post(_review(ns, i))),
            ),
            _phase(
                "direct+pods",
                proc,
                mport,
                seen,
                lambda: _beside(
                    lambda: _at_rate(n, rate, lambda i: direct.post(_review(ns, i))),
                    lambda: _at_rate(n, rate, create("busy")),
                ),
            ),
        ]
        base, hooked = phases[0], phases[1]
        out = {
            "rate_per_s": rate,
            "requests_per_phase": n,
            "phases": phases,
            "pod_create_p50_ratio_webhook_vs_baseline": round(hooked["p50_ms"] / base["p50_ms"], 2),
            "webhook_added_p50_ms": round(hooked["p50_ms"] - base["p50_ms"], 2),
            "webhook_added_p99_ms": round(hooked["p99_ms"] - base["p99_ms"], 2),
            "kopf_handlers": args.handlers,
            "cores": os.cpu_count(),
            "command": " ".join([sys.executable, *sys.argv]),
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        adm.delete_mutating_webhook_configuration(mwc)
        core.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())

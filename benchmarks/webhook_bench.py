"""Webhook latency at a steady pod-creation rate, against the real kube-apiserver.

    .venv/bin/python benchmarks/webhook_bench.py [--rate 50] [--pods 300] [--kubeconfig PATH]

Starts `dynamiccl operator --no-handlers` as a local process, registers it with
a MutatingWebhookConfiguration (clientConfig.url https://127.0.0.1:<port>/mutate),
creates a job ConfigMap, then creates pods of that job at `--rate` per second.
Reports:
- server-side webhook latency p50/p99 (the operator's own per-request timings,
  from dynamiccl_webhook_duration_seconds: bucket upper bounds);
- client-side pod CREATE latency p50/p99 with the webhook, and the same for
  pods the webhook does not select (baseline, same run) — and the ratio.
Target (issue #4): webhook p99 <= 10 ms at 50 pod creations/s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dynamiccl import constants as c

CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _hist_quantile(text: str, q: float) -> float:
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith("dynamiccl_webhook_duration_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return float("inf")


def _create_at_rate(core: k8s.CoreV1Api, ns: str, job: str, n: int, rate: float) -> list[float]:
    lat: list[float] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        body = {
            "metadata": {"name": f"{job}-{i}", "labels": {c.LABEL_KUBEFLOW_JOB_NAME: job}},
            "spec": {"containers": [{"name": "t", "image": "example.invalid/t:1"}]},
        }
        t0 = time.perf_counter()
        core.create_namespaced_pod(ns, body)
        with lock:
            lat.append(time.perf_counter() - t0)

    threads = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(i,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return lat


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG") or str(CACHE / "cluster/kubeconfig")
    )
    args = ap.parse_args()
    api = k8s_config.new_client_from_config(config_file=args.kubeconfig)
    core, adm = k8s.CoreV1Api(api), k8s.AdmissionregistrationV1Api(api)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    port, mport = _port(), _port()
    mwc = f"dynamiccl-bench-{ns}"
    adm.create_mutating_webhook_configuration(
        {
            "metadata": {"name": mwc},
            "webhooks": [
                {
                    "name": "pods.dynamiccl.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 3,
                    "reinvocationPolicy": "IfNeeded",
                    "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "objectSelector": {
                        "matchExpressions": [
                            {
                                "key": c.LABEL_KUBEFLOW_JOB_NAME,
                                "operator": "In",
                                "values": ["tuned"],
                            }
                        ]
                    },
                }
            ],
        }
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.cli",
            "operator",
            "--no-handlers",
            "--kubeconfig",
            args.kubeconfig,
            "--namespace",
            ns,
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--metrics-port",
            str(mport),
            "--webhook-config",
            mwc,
            "--extra-san",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        for _ in range(200):
            try:
                urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        core.create_namespaced_config_map(
            ns,
            {
                "metadata": {
                    "name": "tuned-dynamiccl",
                    "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "job-config"},
                },
                "data": {"env.json": "{}"},
            },
        )
        time.sleep(1.5)
        base = _create_at_rate(core, ns, "plain", args.pods, args.rate)
        tuned = _create_at_rate(core, ns, "tuned", args.pods, args.rate)
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        )
        mutated = [
            ln
            for ln in metrics.splitlines()
            if ln.startswith('dynamiccl_webhook_requests_total{result="mutated"}')
        ]
        out = {
            "rate_per_s": args.rate,
            "pods": args.pods,
            "webhook_server_p50_le_ms": _hist_quantile(metrics, 0.5) * 1e3,
            "webhook_server_p99_le_ms": _hist_quantile(metrics, 0.99) * 1e3,
            "mutated": float(mutated[0].split()[-1]) if mutated else 0.0,
            "pod_create_p50_ms_with_webhook": _pct(tuned, 0.5) * 1e3,
            "pod_create_p99_ms_with_webhook": _pct(tuned, 0.99) * 1e3,
            "pod_create_p50_ms_baseline": _pct(base, 0.5) * 1e3,
            "pod_create_p99_ms_baseline": _pct(base, 0.99) * 1e3,
            "p50_ratio_vs_baseline": statistics.median(tuned) / statistics.median(base),
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        adm.delete_mutating_webhook_configuration(mwc)
        core.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())

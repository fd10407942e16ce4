"""Job created → its ConfigMap ready, against the real kube-apiserver.

    .venv/bin/python benchmarks/configmap_bench.py [--jobs 200] [--rate 10] [--kubeconfig PATH]

Starts ``dynamiccl operator`` (kopf handlers + webhook, standalone, watching
only the bench namespace) as a local process with an NCCLTuningPolicy for the
bench namespace, then creates annotated PyTorchJobs at ``--rate`` per second.
Latency of a job = from the start of its CREATE call to the moment a watch on
the namespace's ConfigMaps sees ``<job>-dynamiccl``. The jobs are suspended
(``runPolicy.suspend``): the training operator creates no pods, so what is
measured is the operator's own path (kopf event → features → table → ConfigMap
write), not pod churn on a 2-core machine; ``--with-pods`` runs them unsuspended.

Baseline, same run, same watch: ConfigMaps the bench creates itself (CREATE
start → seen by the watch) — the apiserver + watch floor every job pays too.
Target (issue #4): p99 <= 1 s.
"""

from __future__ import annotations

import argparse
import base64
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
from kubernetes import watch as k8s_watch

from dynamiccl import constants as c
from dynamiccl.testing import builders
from dynamiccl.testing.ports import free_port

CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
NTP = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
PT = ("kubeflow.org", "v1", "pytorchjobs")
TICKS = os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Seen:
    """First time a watch saw each ConfigMap name (monotonic clock)."""

    def __init__(self, core: k8s.CoreV1Api, ns: str) -> None:
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()
        self._w = k8s_watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated
        self._t = threading.Thread(target=self._run, args=(core, ns), daemon=True)
        self._t.start()

    def _run(self, core: k8s.CoreV1Api, ns: str) -> None:
        try:
            for ev in self._w.stream(core.list_namespaced_config_map, ns, timeout_seconds=3600):  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated
                name = ev["object"].metadata.name
                with self.cond:
                    self.at.setdefault(name, time.monotonic())
                    self.cond.notify_all()
        except Exception:  # the namespace went away at the end of the run
            return

    def wait(self, names: list[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: all(n in self.at for n in names), timeout)

    def stop(self) -> None:
        self._w.stop()  # type: ignore[no-untyped-call]  # kubernetes.watch is unannotated


def _at_rate(n: int, rate: float, one: Callable[[int], None]) -> dict[int, float]:
    """Start ``one(i)`` at ``rate``/s (a thread each); the start time of each call."""
    started: dict[int, float] = {}
    threads = []
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started[i] = time.monotonic()
        th = threading.Thread(target=one, args=(i,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return started


def _job(name: str, suspend: bool) -> dict[str, Any]:
    return builders.pytorchjob(
        name,
        annotations={c.ANNOTATION_TUNE: "true"},
        workers=0,
        pod=builders.template(builders.container(gpus=1)),
        nproc_per_node="1",
        suspend=suspend,
    )


def _summary(lat: list[float]) -> dict[str, float]:
    return {
        "n": len(lat),
        "p50_ms": round(_pct(lat, 0.5) * 1e3, 1),
        "p99_ms": round(_pct(lat, 0.99) * 1e3, 1),
        "max_ms": round(max(lat) * 1e3, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rate", type=float, default=10.0, help="job creations per second")
    ap.add_argument("--with-pods", action="store_true", help="jobs not suspended (pods created)")
    ap.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG") or str(CACHE / "cluster/kubeconfig")
    )
    args = ap.parse_args()
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
    cfg.connection_pool_maxsize = 64
    api = k8s.ApiClient(cfg)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    ns = f"cmbench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    policy = ns
    custom.create_cluster_custom_object(
        *NTP,
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            "spec": {
                "mode": "static",
                "priority": 1000,
                "selector": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        },
    )
    port, mport = free_port(), free_port()
    # fmt: off
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl.cli", "operator", f"--kubeconfig={args.kubeconfig}",
         f"--namespace={ns}", f"--watch-namespace={ns}", "--webhook-host=127.0.0.1",
         f"--webhook-port={port}", f"--metrics-port={mport}", "--webhook-config=none",
         "--extra-san=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    # fmt: on
    seen = Seen(core, ns)
    try:
        # Ready = webhook up and the handlers reconcile (a warm-up job got its ConfigMap).
        for _ in range(600):
            try:
                secret = core.read_namespaced_secret("dynamiccl-webhook-tls", ns)
                ca = base64.b64decode((secret.data or {})["ca.crt"]).decode()
                ctx = ssl.create_default_context(cadata=ca)
                urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2)
                break
            except Exception:
                time.sleep(0.2)
        custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], _job("warmup", True))
        assert seen.wait(["warmup-dynamiccl"], 300), "the operator never reconciled"

        def make_cm(i: int) -> None:
            body = {"metadata": {"name": f"base-{i}"}, "data": {"x": "y"}}
            core.create_namespaced_config_map(ns, body, _preload_content=False).read()  # type: ignore[arg-type, attr-defined]  # dict body; _preload_content=False: raw response

        def make_job(i: int) -> None:
            job = _job(f"job-{i}", not args.with_pods)
            custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], job)

        n, rate = args.jobs, args.rate
        base_start = _at_rate(n, rate, make_cm)
        seen.wait([f"base-{i}" for i in range(n)], 120)
        cpu0 = _cpu_seconds(proc.pid)
        job_start = _at_rate(n, rate, make_job)
        complete = seen.wait([f"job-{i}-dynamiccl" for i in range(n)], 300)
        cpu = _cpu_seconds(proc.pid) - cpu0
        base = [seen.at[f"base-{i}"] - t for i, t in base_start.items() if f"base-{i}" in seen.at]
        jobs = [
            seen.at[f"job-{i}-dynamiccl"] - t
            for i, t in job_start.items()
            if f"job-{i}-dynamiccl" in seen.at
        ]
        out = {
            "jobs": n,
            "rate_per_s": rate,
            "suspended_jobs_no_pods": not args.with_pods,
            "all_configmaps_seen": complete,
            "job_to_configmap": _summary(jobs),
            "baseline_configmap_create_to_watch": _summary(base),
            "p99_ratio_vs_baseline": round(_pct(jobs, 0.99) / _pct(base, 0.99), 2),
            "operator_cpu_ms_per_job": round(cpu * 1e3 / n, 1),
            "loadavg_1m": round(os.getloadavg()[0], 1),
            "cores": os.cpu_count(),
            "command": " ".join([sys.executable, *sys.argv]),
        }
        print(json.dumps(out, indent=2))
    finally:
        seen.stop()
        proc.terminate()
        proc.wait(timeout=60)
        custom.delete_cluster_custom_object(*NTP, policy)
        core.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())

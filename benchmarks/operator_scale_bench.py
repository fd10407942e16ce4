"""Operator memory (RSS) and reconcile latency with 1000 tuned jobs across 2000 nodes.

Run it against a PRIVATE control plane: it creates thousands of cluster-scoped
Node objects, which every controller of a shared cluster would have to carry.

    export DYNAMICCL_PORT_BASE=44000 DYNAMICCL_CLUSTER_DIR=/tmp/dcl-scale
    bash hack/cluster-up.sh --no-build
    .venv/bin/python benchmarks/operator_scale_bench.py --kubeconfig /tmp/dcl-scale/kubeconfig
    bash hack/cluster-down.sh --wipe

What is created (and deleted again at the end):

- ``--nodes`` Node objects with GPU Feature Discovery / topograph / zone labels
  (4 hardware kinds, 32 nodes per leaf switch, 500 per zone) and 8 GPUs of
  capacity. They are plain Node objects (no kwok annotation: nothing heart-beats
  2000 leases on 2 cores), cordoned and tainted so nothing is scheduled there;
- ``--jobs`` annotated PyTorchJobs (Master + Worker, 8 GPUs each) in one
  namespace, SUSPENDED so the training operator creates no pods; instead the
  bench creates each job's two pods itself, bound (``spec.nodeName``) to two of
  the bench nodes — the operator then refines every job's features from the
  nodes its pods landed on, exactly as for pods the training operator made;
- one NCCLTuningPolicy selecting that namespace (and our CRDs from ``crds/``
  if the cluster lacks them; those are left in place).

``dynamiccl operator`` runs cluster-wide as deployed (kopf handlers + webhook,
standalone), as a local process. Reported: its RSS idle (16 cluster-up nodes),
with the extra nodes, and with every job tuned and refined (current and peak),
the per-job latency from the job's CREATE to its ConfigMap seen by a watch, and
the operator's CPU time. Target (issue #4): RSS <= 200 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, cast

import scale_cluster as sc  # benchmarks/, this script's folder
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing.ports import free_port

SHARED = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
TICKS = os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024  # MiB
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _metrics(port: int) -> dict[str, float]:
    """The operator's reconcile counters and time (sum) from its /metrics."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("dynamiccl_reconciles_total", "dynamiccl_reconcile_duration_seconds_")):
            key, value = line.rsplit(" ", 1)
            if "_bucket" not in key and "_created" not in key:
                out[key.replace("dynamiccl_", "")] = round(float(value), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kubeconfig", required=True, help="a PRIVATE cluster's kubeconfig")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=40.0, help="object creations per second")
    ap.add_argument(
        "--shared-cluster-ok", action="store_true", help="allow the shared default cluster"
    )
    ap.add_argument(
        "--without-compiler",
        action="store_true",
        help="run the operator with the policy compiler (torch) unimportable: tables are "
        "NCCL passthrough; shows what the operator itself costs",
    )
    ap.add_argument("--operator-log", type=Path, help="write the operator's log here")
    args = ap.parse_args()
    shared = (SHARED / "cluster" / "kubeconfig").resolve()
    if Path(args.kubeconfig).resolve() == shared and not args.shared_cluster_ok:
        print(
            "operator_scale_bench: refusing to add thousands of nodes to the shared cluster;"
            " start a private one (see --help)",
            file=sys.stderr,
        )
        return 2
    if args.jobs * 2 > args.nodes:
        print("operator_scale_bench: --nodes must be >= 2 x --jobs", file=sys.stderr)
        return 2
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
    cfg.connection_pool_maxsize = 32
    api = k8s.ApiClient(cfg)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    sc.ensure_crds(k8s.ApiextensionsV1Api(api))
    ns = f"scale-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    custom.create_cluster_custom_object(
        *sc.NTP,
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": ns},
            "spec": {
                "mode": "static",
                "priority": 1000,
                "selector": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        },
    )
    mport = free_port()
    # fmt: off
    launcher = ["-m", "dynamiccl.cli"]
    if args.without_compiler:  # an import of dynamiccl.policy.runtime.compile raises ImportError
        launcher = ["-c", "import sys; sys.modules['dynamiccl.policy.runtime.compile'] = None; "
                    "sys.argv[0] = 'dynamiccl'; from dynamiccl.cli import main; main()"]
    proc = subprocess.Popen(
        [sys.executable, *launcher, "operator", f"--kubeconfig={args.kubeconfig}",
         f"--namespace={ns}", "--webhook-host=127.0.0.1", f"--webhook-port={free_port()}",
         f"--metrics-port={mport}", "--webhook-config=none", "--extra-san=127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=args.operator_log.open("wb") if args.operator_log else subprocess.DEVNULL,
    )
    # fmt: on
    seen = sc.ConfigMapsSeen(core, ns)
    nodes = [sc.node(i) for i in range(args.nodes)]
    out: dict[str, Any] = {"nodes": args.nodes, "jobs": args.jobs, "pods": 2 * args.jobs}
    out["policy_compiler_loaded"] = not args.without_compiler
    try:
        warm = cast(  # the custom-objects API returns the object's JSON
            dict[str, Any],
            custom.create_namespaced_custom_object(*sc.PT[:2], ns, sc.PT[2], sc.job(9999)),
        )
        sc.wait("operator ready", lambda: "job-9999-dynamiccl" in seen.at, 600)
        custom.delete_namespaced_custom_object(*sc.PT[:2], ns, sc.PT[2], warm["metadata"]["name"])
        time.sleep(10)
        out["rss_mib_idle"] = _proc_status(proc.pid)["VmRSS"]

        def make_node(body: dict[str, Any]) -> None:
            name = body["metadata"]["name"]
            try:
                core.create_node(body, _preload_content=False).read()  # type: ignore[arg-type, attr-defined]  # dict body; _preload_content=False: raw response
            except ApiException as exc:
                if exc.status != 409:
                    raise
            patch = {
                "status": {"capacity": {c.RESOURCE_GPU: "8"}, "allocatable": {c.RESOURCE_GPU: "8"}}
            }
            core.patch_node_status(name, patch, _preload_content=False).read()  # type: ignore[attr-defined]  # _preload_content=False: the raw response

        t0 = time.monotonic()
        sc.parallel(nodes, make_node, args.rate * 2)
        out["node_create_s"] = round(time.monotonic() - t0, 1)
        time.sleep(15)
        out["rss_mib_with_nodes"] = _proc_status(proc.pid)["VmRSS"]

        started: dict[str, float] = {}

        def make_job(i: int) -> None:
            job = sc.job(i)
            started[job["metadata"]["name"]] = time.monotonic()
            created = cast(  # the custom-objects API returns the object's JSON
                dict[str, Any],
                custom.create_namespaced_custom_object(*sc.PT[:2], ns, sc.PT[2], job),
            )
            for k, role in enumerate(("master", "worker")):
                node = nodes[(2 * i + k) % len(nodes)]["metadata"]["name"]
                body = sc.pod(created, role, node)
                core.create_namespaced_pod(ns, body, _preload_content=False).read()  # type: ignore[arg-type, attr-defined]  # dict body; _preload_content=False: raw response

        cpu0 = _cpu_seconds(proc.pid)
        t0 = time.monotonic()
        sc.parallel(range(args.jobs), make_job, args.rate / 3)
        out["job_and_pod_create_s"] = round(time.monotonic() - t0, 1)
        names = [f"job-{i:04d}-dynamiccl" for i in range(args.jobs)]
        out["wait_configmaps_s"] = round(
            sc.wait("every ConfigMap", lambda: all(n in seen.at for n in names), 900), 1
        )

        def refined() -> bool:
            listed = custom.list_namespaced_custom_object(*sc.TR[:2], ns, sc.TR[2])
            runs = cast(dict[str, Any], listed)["items"]  # the list's JSON
            done = [r for r in runs if (r["spec"].get("features") or {}).get("scheduled")]
            out["tuning_runs_refined"] = len(done)
            return bool(len(done) >= args.jobs)

        out["wait_refined_s"] = round(sc.wait("features refined from the pods", refined, 900), 1)
        time.sleep(15)
        status = _proc_status(proc.pid)
        out["rss_mib_with_jobs"] = status["VmRSS"]
        out["rss_mib_peak"] = status["VmHWM"]
        out["operator_cpu_s_jobs_phase"] = round(_cpu_seconds(proc.pid) - cpu0, 1)
        lat = [seen.at[f"{j}-dynamiccl"] - t for j, t in started.items()]
        out["job_to_configmap_ms"] = {
            "p50": round(_pct(lat, 0.5) * 1e3, 1),
            "p99": round(_pct(lat, 0.99) * 1e3, 1),
            "max": round(max(lat) * 1e3, 1),
        }
        out["operator_metrics"] = _metrics(mport)
        out["target_rss_mib"] = 200
        out["loadavg_1m"] = round(os.getloadavg()[0], 1)
        out["command"] = " ".join([sys.executable, *sys.argv])
        print(json.dumps(out, indent=2))
    finally:
        seen.stop()
        proc.terminate()
        proc.wait(timeout=60)
        custom.delete_cluster_custom_object(*sc.NTP, ns)
        # No kubelet will ever confirm these pods' deletion: remove them outright.
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_namespace(ns)

        def drop(body: dict[str, Any]) -> None:
            try:
                core.delete_node(body["metadata"]["name"], _preload_content=False).read()  # type: ignore[attr-defined]  # _preload_content=False: the raw response
            except ApiException as exc:
                if exc.status != 404:
                    raise

        sc.parallel(nodes, drop, 200)

        def ns_gone() -> bool:
            try:
                core.read_namespace(ns)
            except ApiException as exc:
                return bool(exc.status == 404)
            return False

        sc.wait(f"namespace {ns} deleted", ns_gone, 600)  # the next run starts clean
    return 0


if __name__ == "__main__":
    sys.exit(main())

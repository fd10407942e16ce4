"""`make demo-cluster`: the demo's story on a real control plane (`hack/demo-cluster.sh`).

On the local control plane of `hack/cluster-up.sh` (real apiserver, scheduler,
Kubeflow training operator; kwok plays the kubelets of 16 fake GPU nodes):

1. `helm install` of `charts/dynamiccl`. kwok never runs our image, so the
   operator and the reward ingest the chart deploys run here as local
   processes with the chart's own arguments (as the e2e tests do); the chart's
   `webhook.url` makes the apiserver call the local webhook.
2. A namespace labelled `team=ml`, the sample policy `ml-learned` (renamed
   and limited to this namespace: the cluster is shared), and the annotated
   PyTorchJob of `examples/` — created with `kubectl apply`. The training
   operator creates its pods, the real webhook injects them, the scheduler
   binds them to H100 nodes, the operator writes the ConfigMap and TuningRun.
3. The pods' containers are played here, since kwok runs none: for each pod
   its sidecar (`dynamiccl agent`, epoch record through ConfigMaps on the
   apiserver) and its 8 rank processes on the real plugin; rewards go to the
   ingest with tokens minted by TokenRequest (pod-bound, audience
   `dynamiccl-ingest`) and checked by a real TokenReview.
4. The learning loop in the ingest process writes the job's reward into the
   TuningRun status: `kubectl get tuningrun` shows the speedup.

Objects stay for inspection; `hack/demo-cluster.sh --clean` removes them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dynamiccl import constants as c
from dynamiccl.demo.job import Incarnation
from dynamiccl.demo.kube_manifests import (
    CHART,
    NAMESPACE,
    POLICY,
    RELEASE,
    SYSTEM_NS,
    chart_values,
    demo_policy,
    job_manifest,
    operator_args,
    plans,
    sidecar_command,
)
from dynamiccl.demo.pipeline import STEPS_FAST, plugin_lib
from dynamiccl.demo.run import RunConfig, run
from dynamiccl.demo.workload import STEP, build_time_table
from dynamiccl.kubeclient import api_client


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """The apiserver through the kubernetes client, helm and kubectl binaries."""

    def __init__(self, kubeconfig: str, bin_dir: Path) -> None:
        from kubernetes import client  # noqa: PLC0415 - heavy, only here

        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.core: Any = client.CoreV1Api(self.api)  # dynamic client shapes: Any
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.helm = str(bin_dir / "helm")
        self.kubectl = str(bin_dir / "kubectl")

    def sh(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            list(args), input=stdin, capture_output=True, text=True, timeout=300, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])}: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def apply(self, doc: Mapping[str, Any]) -> None:
        self.sh(
            self.kubectl,
            "--kubeconfig",
            self.kubeconfig,
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump(dict(doc)),
        )

    def token(self, pod: Mapping[str, Any]) -> str:
        """A pod-bound, audience-bound token of the pod's ServiceAccount (TokenRequest)."""
        meta = pod["metadata"]
        sa = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        req = self.core.create_namespaced_service_account_token(
            sa,
            meta["namespace"],
            {
                "spec": {
                    "audiences": [c.INGEST_AUDIENCE],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                }
            },
        )
        return str(req.status.token)

    def wait(self, what: str, fn: Callable[[], Any], timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = fn()
            except Exception:  # not there yet (404) or the apiserver is busy
                got = None
            if got:
                return got
            time.sleep(1)
        raise RuntimeError(f"timed out waiting for {what}")


def _say(msg: str) -> None:
    print(f"demo-cluster: {msg}", file=sys.stderr, flush=True)


def clean(cl: Cluster) -> None:
    """Remove everything the demo created (never touches other releases or namespaces)."""
    for args in (
        [
            cl.kubectl,
            "--kubeconfig",
            cl.kubeconfig,
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        ],
        [
            cl.kubectl,
            "--kubeconfig",
            cl.kubeconfig,
            "delete",
            "nccltuningpolicy",
            POLICY,
            "--ignore-not-found",
        ],
        [
            cl.helm,
            "--kubeconfig",
            cl.kubeconfig,
            "uninstall",
            RELEASE,
            "-n",
            SYSTEM_NS,
            "--ignore-not-found",
        ],
        [
            cl.kubectl,
            "--kubeconfig",
            cl.kubeconfig,
            "delete",
            "namespace",
            SYSTEM_NS,
            "--ignore-not-found",
            "--wait=false",
        ],
    ):
        subprocess.run(args, capture_output=True, timeout=120, check=False)


def _spawn(argv: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **kw)
    finally:
        out.close()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _obj(cl: Cluster, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = cl.api.sanitize_for_serialization(obj)
    return out


def start_services(cl: Cluster, out: Path) -> tuple[list[subprocess.Popen[bytes]], int]:
    """helm install; the chart's operator and ingest as local processes. Returns (procs, port)."""
    port, ingest_port = free_port(), free_port()
    values = out / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(port)))
    base = ["--kubeconfig", cl.kubeconfig, "-n", SYSTEM_NS]
    _say(f"helm install {RELEASE} charts/dynamiccl (webhook at 127.0.0.1:{port})")
    cl.sh(
        cl.helm,
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        *base,
        "--create-namespace",
        "-f",
        str(values),
    )
    manifest = cl.sh(cl.helm, "get", "manifest", RELEASE, *base)
    args = operator_args(manifest, port, free_port(), cl.kubeconfig)
    args.append(f"--ingest-url=https://127.0.0.1:{ingest_port}{c.INGEST_PATH}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [_spawn([sys.executable, "-m", "dynamiccl.cli", *args], out / "operator.log", env=env)]
    secret = f"{RELEASE}-webhook-tls"
    data = cl.wait(
        "the operator's TLS secret",
        lambda: cl.core.read_namespaced_secret(secret, SYSTEM_NS).data,
    )
    tls = out / "tls"
    tls.mkdir(exist_ok=True)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tls / key).write_bytes(base64.b64decode(data[key]))
    cl.wait("the webhook", lambda: _port_open(port))
    _say(
        f"reward ingest + learning loop at 127.0.0.1:{ingest_port} (same certificate, as the chart)"
    )
    ingest = [
        sys.executable, "-m", "dynamiccl.operator.ingest.main",
        "--store", f"sqlite:///{out / 'store.sqlite'}", "--host", "127.0.0.1",
        "--port", str(ingest_port), "--tls-cert", str(tls / "tls.crt"),
        "--tls-key", str(tls / "tls.key"), "--kubeconfig", cl.kubeconfig,
        "--loop-namespace", SYSTEM_NS, "--loop-image", "unused", "--loop-pvc", "unused",
        "--loop-interval", "2",
    ]  # fmt: skip
    procs.append(_spawn(ingest, out / "ingest.log", env=env))
    cl.wait("the ingest", lambda: _port_open(ingest_port))
    return procs, ingest_port


def create_job(cl: Cluster) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Namespace, policy, the PyTorchJob (suspended until its ConfigMap exists), bound pods."""
    labels = {"team": "ml", c.LABEL_DEMO_RELEASE: RELEASE}
    cl.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    )
    cl.apply(demo_policy())
    job = job_manifest()
    name = job["metadata"]["name"]
    k = ["--kubeconfig", cl.kubeconfig, "-n", NAMESPACE]
    cl.sh(cl.kubectl, *k, "delete", "pytorchjob", name, "--ignore-not-found", "--wait=true")
    job["spec"]["runPolicy"] = {"suspend": True}  # no pods before the operator decided
    _say(f"kubectl apply -f examples/pytorchjob.yaml (namespace {NAMESPACE})")
    cl.apply(job)
    cm_name = f"{name}-dynamiccl"
    cl.wait("the job's ConfigMap", lambda: cl.core.read_namespaced_config_map(cm_name, NAMESPACE))
    patch = json.dumps({"spec": {"runPolicy": {"suspend": False}}})
    cl.sh(cl.kubectl, *k, "patch", "pytorchjob", name, "--type=merge", "-p", patch)
    sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={name}"

    def running() -> list[Any]:
        items = cl.core.list_namespaced_pod(NAMESPACE, label_selector=sel).items
        ok = len(items) == 2 and all(p.status.phase == "Running" for p in items)
        return items if ok else []

    pods = [_obj(cl, p) for p in cl.wait("2 Running pods", running)]
    tr_api = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", cm_name)
    cl.wait(
        "the TuningRun refined from the bound pods",
        lambda: cl.custom.get_namespaced_custom_object(*tr_api)["spec"]["features"]["scheduled"],
    )
    cm = _obj(cl, cl.core.read_namespaced_config_map(cm_name, NAMESPACE))
    obj = dict(
        cl.custom.get_namespaced_custom_object("kubeflow.org", "v1", NAMESPACE, "pytorchjobs", name)
    )
    return obj, pods, cm


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hack/demo-cluster.sh`."""
    from dynamiccl.api.features import StateFeatures  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="hack/demo-cluster.sh")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--bin-dir", type=Path, required=True, help="pinned helm and kubectl")
    p.add_argument("--out", type=Path, default=Path("demo-cluster-out"))
    p.add_argument("--steps", type=int, default=STEPS_FAST)
    p.add_argument("--clean", action="store_true", help="remove what the demo created")
    a = p.parse_args(argv)
    cl = Cluster(a.kubeconfig, a.bin_dir)
    if a.clean:
        clean(cl)
        _say("removed the demo's namespaces, policy and helm release")
        return 0
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "run", ignore_errors=True)  # a fresh run's logs, not appended ones
    for old in (
        "store.sqlite",
        "store.sqlite-wal",
        "store.sqlite-shm",
        "operator.log",
        "ingest.log",
    ):
        (out / old).unlink(missing_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    k = [cl.kubectl, "--kubeconfig", cl.kubeconfig, "-n", NAMESPACE]
    try:
        procs, _ = start_services(cl, out)
        job, pods, cm = create_job(cl)
        print(cl.sh(*k, "get", "pods", "-o", "wide"), flush=True)
        print(cl.sh(*k, "get", "tuningrun"), flush=True)
        features = StateFeatures.model_validate_json(cm["data"]["features.json"])
        times = build_time_table(features.topology.spec())
        times.write(out / "times.json")
        tr = dict(cl.custom.get_namespaced_custom_object(
            c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", cm["metadata"]["name"]))  # fmt: skip
        meta = json.loads(cm["data"]["job.json"])
        inc = Incarnation(
            job=job, config_map=cm, tuning_run=tr, estimated=features, features=features,
            pods=tuple(pods), plans=tuple(plans(pods, features.nproc_per_node)),
            model_version=str(meta.get("model_version", "")), canary=bool(meta.get("canary")),
            policy_name=POLICY, message="",
        )  # fmt: skip
        _say(f"playing the pods here: 2 sidecars + {features.world_size} ranks on the real plugin")
        cfg = RunConfig(
            steps=a.steps, seed=1, time_table=out / "times.json", image_lib=plugin_lib(),
            ops=[(o.collective.nccl_id, o.nbytes, o.repeat) for o in STEP],
            sidecar=sidecar_command(cl.kubeconfig, out / "tls" / "ca.crt"),
        )  # fmt: skip
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.monotonic() - last[0] > 5 or done == total:
                last[0] = time.monotonic()
                _say(f"{done}/{total} collective calls")

        run(inc, cfg, out / "run", cl.token, progress)
        name = cm["metadata"]["name"]
        tr_api = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", name)
        cl.wait(
            "the learning loop to write the TuningRun's reward",
            lambda: (
                (cl.custom.get_namespaced_custom_object(*tr_api).get("status") or {})
                .get("reward", {})
                .get("speedup")
            ),
            timeout=120,
        )
        print(cl.sh(*k, "get", "tuningrun"), flush=True)
        _say(f"kubectl -n {NAMESPACE} get tuningrun {name} -o yaml   # the whole status")
        _say(f"logs and files: {out}; remove everything: hack/demo-cluster.sh --clean")
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())

"""`make demo-cluster`: issue 21's story on a real control plane (`hack/demo-cluster.sh`).

On the local control plane of `hack/cluster-up.sh` (real apiserver, scheduler,
Job controller, Kubeflow training operator; kwok plays the kubelets of 16 fake
GPU nodes):

1. `helm install` of `charts/dynamiccl`. kwok never runs our image, so the
   operator and the reward ingest (with its learning loop) the chart deploys
   run here as local processes with the chart's own arguments (the store's
   volume a local directory; the operator's ServiceAccount token for fetching
   models from the ingest minted by TokenRequest); the chart's `webhook.url`
   makes the apiserver call the local webhook. The store is a throw-away
   PostgreSQL server (hack/pg_server.py; `--store sqlite` for SQLite).
2. A namespace labelled `team=ml` and the demo's learned policy (the sample's
   selector, limited to this namespace: the cluster is shared).
3. Jobs in a row on one hardware class, the learning loop between them
   (`kube_sequence.py`: what is real and what stands in): the first jobs
   explore within budget and find where the surface departs from NCCL's model,
   the loop retrains, the operator gives the new version to the canary share
   of jobs, which run the found configuration; one line per job, then the
   numbers (`story.py`).

Objects stay for inspection;
`hack/demo-cluster.sh --clean` removes them.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dynamiccl import constants as c
from dynamiccl.demo.kube_manifests import (
    CHART,
    NAMESPACE,
    POLICY,
    RELEASE,
    SYSTEM_NS,
    chart_values,
    ingest_args,
    learning_policy,
    operator_args,
)
from dynamiccl.testing.kubectl import Cluster
from dynamiccl.testing.ports import free_port
from dynamiccl.testing.surface import Departure


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


def _model_reader(args: Sequence[str]) -> tuple[str, str]:
    """(namespace, ServiceAccount) the chart lets fetch models: the operator's."""
    for a in args:
        if a.startswith("--model-reader=system:serviceaccount:"):
            ns, name = a.split("=", 1)[1].removeprefix("system:serviceaccount:").split(":", 1)
            return ns, name
    raise RuntimeError("the chart's ingest names no --model-reader")


def _sa_token(cl: Cluster, namespace: str, name: str) -> str:
    """A token of a ServiceAccount for the ingest's audience (what the chart projects)."""
    body = {"spec": {"audiences": [c.INGEST_AUDIENCE], "expirationSeconds": 3600}}
    req = cl.core.create_namespaced_service_account_token(name, namespace, body)
    return str(req.status.token)


def start_services(
    cl: Cluster, out: Path, store_url: str = ""
) -> tuple[list[subprocess.Popen[bytes]], int]:
    """helm install; the chart's operator and ingest (with its learning loop) as local processes
    with the chart's arguments. `store_url`: the store (default SQLite in `out`).
    Returns (procs, ingest port)."""
    port, ingest_port = free_port(), free_port()
    values = out / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(port, store_url)))
    base = ["--kubeconfig", cl.kubeconfig, "-n", SYSTEM_NS]
    _say(f"helm install {RELEASE} charts/dynamiccl (webhook at 127.0.0.1:{port})")
    cl.sh(
        cl.helm, "upgrade", "--install", RELEASE, str(CHART), *base, "--create-namespace",
        "-f", str(values),
    )  # fmt: skip
    manifest = cl.sh(cl.helm, "get", "manifest", RELEASE, *base)
    tls = out / "tls"
    tls.mkdir(exist_ok=True)
    iargs = ingest_args(manifest, ingest_port, tls, cl.kubeconfig, out / "volume")
    token = out / "operator-token"
    token.write_text(_sa_token(cl, *_model_reader(iargs)))
    args = operator_args(manifest, port, free_port(), cl.kubeconfig, token)
    # The cluster is shared: reconcile only the demo's jobs (a namespaced operator elects no
    # leader through the chart's ClusterKopfPeering, and one process needs none).
    args = [a for a in args if not a.startswith("--peering=")]
    args.append(f"--watch-namespace={NAMESPACE}")
    args.append(f"--ingest-url=https://127.0.0.1:{ingest_port}{c.INGEST_PATH}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [_spawn([sys.executable, "-m", "dynamiccl.cli", *args], out / "operator.log", env=env)]
    secret = f"{RELEASE}-webhook-tls"
    data = cl.wait(
        "the operator's TLS secret",
        lambda: cl.core.read_namespaced_secret(secret, SYSTEM_NS).data,
    )
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tls / key).write_bytes(base64.b64decode(data[key]))
    cl.wait("the webhook", lambda: _port_open(port))
    _say(
        f"reward ingest + learning loop at 127.0.0.1:{ingest_port} (same certificate, as the chart)"
    )
    (out / "volume").mkdir(exist_ok=True)
    store = store_url or f"sqlite:///{out / 'store.sqlite'}"
    ienv = {**env, c.ENV_STORE_URL: store}
    ingest = [sys.executable, "-m", "dynamiccl.operator.ingest.main", *iargs]
    procs.append(_spawn(ingest, out / "ingest.log", env=ienv))
    cl.wait("the ingest", lambda: _port_open(ingest_port))
    return procs, ingest_port


def ensure_namespace(cl: Cluster) -> None:
    labels = {"team": "ml", c.LABEL_DEMO_RELEASE: RELEASE}
    cl.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    )


def fresh_start(cl: Cluster, out: Path) -> None:
    """A clean start: no job, policy status or retraining Job of an earlier run."""
    shutil.rmtree(out / "run", ignore_errors=True)
    shutil.rmtree(out / "jobs", ignore_errors=True)
    shutil.rmtree(out / "volume", ignore_errors=True)
    for old in ("store.sqlite", "store.sqlite-wal", "store.sqlite-shm", "operator.log",
                "ingest.log", "retrain.log"):  # fmt: skip
        (out / old).unlink(missing_ok=True)
    kc = [cl.kubectl, "--kubeconfig", cl.kubeconfig]
    retrain = f"{c.GROUP}/component=retrain"
    for args in (
        ["-n", NAMESPACE, "delete", "pytorchjobs", "--all", "--wait=true"],
        ["delete", "nccltuningpolicy", POLICY, "--ignore-not-found", "--wait=true"],
        # with their pods (foreground), which the next run would otherwise see and play
        ["-n", SYSTEM_NS, "delete", "jobs", "-l", retrain, "--cascade=foreground", "--wait=true"],
    ):
        subprocess.run([*kc, *args], capture_output=True, timeout=120, check=False)


def start_store(kind: str, out: Path) -> Any:
    """A throw-away PostgreSQL server (hack/pg_server.py) or None (SQLite in `out`)."""
    if kind != "postgres":
        return None
    import importlib.util  # noqa: PLC0415

    path = Path(__file__).resolve().parents[2] / "hack" / "pg_server.py"
    spec = importlib.util.spec_from_file_location("pg_server", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not mod.available():
        _say("no PostgreSQL server binaries (apt-get install postgresql-15): a SQLite store")
        return None
    pg = mod.PgServer()
    pg.start()
    return pg


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hack/demo-cluster.sh")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--bin-dir", type=Path, required=True, help="pinned helm and kubectl")
    p.add_argument("--out", type=Path, default=Path("demo-cluster-out"))
    p.add_argument("--jobs", type=int, default=8, help="jobs in a row (issue 21's story)")
    p.add_argument("--calls", type=int, default=100_000, help="collective calls per job")
    p.add_argument("--no-departure", action="store_true", help="a surface where NCCL is right")
    p.add_argument(
        "--canary-percent", type=int, default=100,
        help="share of new jobs a retrained version serves first (100: the story fits 8 jobs)",
    )  # fmt: skip
    p.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--clean", action="store_true", help="remove what the demo created")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hack/demo-cluster.sh`."""
    from dynamiccl.demo import kube_sequence as ks  # noqa: PLC0415

    a = _args(argv)
    cl = Cluster(a.kubeconfig, a.bin_dir)
    if a.clean:
        clean(cl)
        _say("removed the demo's namespaces, policy and helm release")
        return 0
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    fresh_start(cl, out)
    procs: list[subprocess.Popen[bytes]] = []
    pg = start_store(a.store, out)
    try:
        procs, ingest_port = start_services(cl, out, pg.url if pg is not None else "")
        settings = ks.SequenceSettings(
            jobs=a.jobs, calls=a.calls, departure=None if a.no_departure else Departure()
        )
        ensure_namespace(cl)
        cl.apply(learning_policy(a.canary_percent, settings.budget_percent))
        ks.run(cl, out, ingest_port, settings, _say)
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
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    sys.exit(main())

"""One helm release of the chart, and the operator serving it as a local process.

conftest.py's session fixture `release` installs it (`installed`); the tests use
`Release` to restart the operator, read its metrics and its log.

kwok pods never run our image, so the operator Deployment the chart creates is
inert here; the same operator runs on this machine instead, started with the
exact arguments of the chart's Deployment (read from ``helm get manifest``)
plus what a local process needs: ``--kubeconfig``, the webhook bound to
127.0.0.1 on a free port, ``--extra-san 127.0.0.1``, a free metrics port.
The chart value ``webhook.url=https://127.0.0.1:<port>/mutate`` makes the
apiserver call it. The cluster is shared: the webhook only sees namespaces
labelled for this release (``webhook.namespaceSelectorExpressions``), the
policy only selects those namespaces, and teardown removes only what the
release and the tests created (helm never deletes CRDs).
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing.ports import free_port
from dynamiccl.testing.waiting import wait_for
from tests.chart_releases import drop_other_releases_policies
from tests.e2e.operator.jobs import PT, pytorchjob

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "dynamiccl"
RELEASE_LABEL = "e2e.dynamiccl.io/release"  # test-only namespace label
NTP = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
LOG_TAIL = 60


def tool(cluster: Any, name: str) -> str:
    """helm/kubectl: the pinned build of a hack/cluster-up.sh cluster, else PATH."""
    pinned = Path(cluster.kubeconfig).parent / "bin" / name
    if pinned.exists():
        return str(pinned)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found (run hack/build-tools.sh)")
    return found


@dataclass
class Release:
    """One helm release of the chart and the local operator serving it."""

    name: str
    namespace: str
    kubeconfig: str
    api: k8s.ApiClient
    helm: str
    kubectl: str
    port: int
    metrics_port: int
    chart_args: list[str]
    image: str
    manifest: str  # `helm get manifest`: what the chart rendered for this release
    log_path: Path
    policy: str = ""
    operator_kubeconfig: str = ""  # the chart's operator ServiceAccount: its RBAC is under test
    probe_namespace: str = ""  # labelled for this release: start() probes the handlers there
    probes: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def webhook_config(self) -> str:
        return chart_arg(self.chart_args, "--webhook-config")

    @property
    def tls_secret(self) -> str:
        return chart_arg(self.chart_args, "--tls-secret")

    def local_args(self) -> list[str]:
        """The chart's operator arguments, adapted to a process on this machine."""
        keep = [
            a
            for a in self.chart_args
            if not a.startswith(("--webhook-port=", "--metrics-port=", "--webhook-host="))
        ]
        return [
            *keep,
            f"--webhook-port={self.port}",
            f"--metrics-port={self.metrics_port}",
            "--webhook-host=127.0.0.1",
            "--extra-san=127.0.0.1",
            f"--kubeconfig={self.operator_kubeconfig or self.kubeconfig}",
        ]

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "operator already running"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamiccl.cli", *self.local_args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.wait_ready()
        if self.probe_namespace:
            self.wait_reconciling()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def ca(self) -> bytes:
        secret = k8s.CoreV1Api(self.api).read_namespaced_secret(self.tls_secret, self.namespace)
        return base64.b64decode((secret.data or {})["ca.crt"])  # KeyError until it is written

    def wait_ready(self, timeout: float = 120) -> None:
        """/readyz answers over TLS verified with the Secret's CA; caBundle in place."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"operator exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                ctx = ssl.create_default_context(cadata=self.ca().decode())
                url = f"https://127.0.0.1:{self.port}/readyz"
                with urllib.request.urlopen(url, context=ctx, timeout=3) as r:
                    ok = r.status == 200
                mwc = k8s.AdmissionregistrationV1Api(self.api).read_mutating_webhook_configuration(
                    self.webhook_config
                )
                bundles = {w.client_config.ca_bundle for w in mwc.webhooks or []}
                if ok and bundles == {base64.b64encode(self.ca()).decode()}:
                    return
            except (OSError, ApiException, KeyError, TypeError, ssl.SSLError):
                pass
            time.sleep(0.5)
        pytest.fail(f"operator not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def wait_reconciling(self, timeout: float = 120) -> None:
        """kopf's handlers are live (not just the webhook): a probe job gets its ConfigMap.

        Without this a job created right after start-up races kopf's own start
        (login, CRD discovery, peering), and its pods are created untuned.
        """
        self.probes += 1
        name, ns = f"probe-{self.probes}", self.probe_namespace
        job = pytorchjob(name, {c.ANNOTATION_TUNE: "true"}, workers=0, gpus=1)
        job["spec"]["runPolicy"] = {"suspend": True}  # no pods
        custom, core = k8s.CustomObjectsApi(self.api), k8s.CoreV1Api(self.api)
        custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], job)
        try:
            wait_for(
                "the operator's handlers to reconcile a probe job",
                lambda: core.read_namespaced_config_map(f"{name}-dynamiccl", ns),
                timeout,
            )
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\noperator log:\n{self.log_tail()}")
        custom.delete_namespaced_custom_object(*PT[:2], ns, PT[2], name)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def log_tail(self, lines: int = LOG_TAIL) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"<no operator log: {exc}>"


def chart_arg(args: list[str], flag: str) -> str:
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise KeyError(flag)


def run_ok(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd[:3])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def chart_deployment(manifest: str, component: str) -> dict[str, Any]:
    """The Deployment `<release>-<component>` of a rendered chart manifest."""
    for doc in yaml.safe_load_all(manifest):
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "Deployment"
            and doc["metadata"]["name"].endswith(f"-{component}")
        ):
            return doc
    pytest.fail(f"the chart rendered no {component} Deployment")


def service_account_kubeconfig(
    admin_kubeconfig: str, core: k8s.CoreV1Api, namespace: str, sa: str, where: Path
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/sa`` (a TokenRequest
    token, one hour): the local operator then has exactly the chart's RBAC, as in a pod."""
    deadline = time.monotonic() + 30
    while True:  # helm created it just now
        try:
            core.read_namespaced_service_account(sa, namespace)
            break
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    req = core.create_namespaced_service_account_token(
        sa,
        namespace,
        {"spec": {"expirationSeconds": 3600}},  # type: ignore[arg-type]  # the client takes dict bodies
    )
    assert req.status is not None
    token = req.status.token
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    ctx_name = admin.get("current-context") or admin["contexts"][0]["name"]
    ctx = next(x["context"] for x in admin["contexts"] if x["name"] == ctx_name)
    cluster = next(x for x in admin["clusters"] if x["name"] == ctx["cluster"])
    user = f"system:serviceaccount:{namespace}:{sa}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": "sa",
    }
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def _policy(name: str) -> dict[str, Any]:
    """The release's static policy: it selects only the namespaces labelled for the release."""
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": name},
        "spec": {
            "mode": "static",
            "priority": 1000,
            "selector": {"namespaceSelector": {"matchLabels": {RELEASE_LABEL: name}}},
            "constraints": {
                "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256], "default": 256}]
            },
        },
    }


def _helm_install(helm: str, name: str, port: int, base: list[str], api: Any) -> None:
    """`helm install` with the webhook pointed at the local operator and scoped to the
    release's namespaces."""
    values = {
        "webhook": {
            "url": f"https://127.0.0.1:{port}/mutate",
            "namespaceSelectorExpressions": [
                {"key": RELEASE_LABEL, "operator": "In", "values": [name]}
            ],
        }
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(values, f)
    try:  # a failed install may still have created objects: the caller's finally removes them
        drop_other_releases_policies(api, name)
        run_ok([helm, "install", name, str(CHART), *base, "--create-namespace", "-f", f.name])
    finally:
        os.unlink(f.name)


def _release(
    cluster: Any, tools: tuple[str, str], name: str, port: int, tmp: pytest.TempPathFactory
) -> tuple[Release, dict[str, Any]]:
    """The Release of an installed chart (its operator's arguments from the manifest), and
    the operator's Deployment."""
    helm, kubectl = tools
    base = ["--kubeconfig", str(cluster.kubeconfig), "-n", f"{name}-system"]
    manifest = run_ok([helm, "get", "manifest", name, *base]).stdout
    deploy = chart_deployment(manifest, "operator")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    rel = Release(
        name=name,
        namespace=f"{name}-system",
        kubeconfig=str(cluster.kubeconfig),
        api=cluster.api,
        helm=helm,
        kubectl=kubectl,
        port=port,
        metrics_port=free_port(),
        chart_args=list(container["args"]),
        image=str(container["image"]),
        manifest=manifest,
        log_path=tmp.mktemp("operator") / "operator.log",
    )
    return rel, deploy


def _teardown(rel: Release | None, helm: str, name: str, base: list[str], api: Any) -> None:
    """Stop the operator; remove the policy, the release and the namespaces it made."""
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    if rel is not None:
        rel.stop()
        if rel.policy:
            try:
                custom.delete_cluster_custom_object(*NTP, rel.policy)
            except ApiException as exc:
                if exc.status != 404:
                    raise
    subprocess.run(
        [helm, "uninstall", name, *base, "--timeout", "60s"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    for ns in (f"{name}-system", f"{name}-probe"):
        try:
            core.delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise


@contextmanager
def installed(cluster: Any, tmp: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed as a new release, its policy, the operator running here with the
    chart's ServiceAccount (its RBAC is under test) and its handlers live; all removed after."""
    helm, kubectl = tool(cluster, "helm"), tool(cluster, "kubectl")
    name = f"dcl-{uuid.uuid4().hex[:6]}"
    namespace = f"{name}-system"
    base = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    port = free_port()
    rel: Release | None = None
    custom, core = k8s.CustomObjectsApi(cluster.api), k8s.CoreV1Api(cluster.api)
    try:
        _helm_install(helm, name, port, base, cluster.api)
        rel, deploy = _release(cluster, (helm, kubectl), name, port, tmp)
        rel.policy = name
        custom.create_cluster_custom_object(*NTP, _policy(name))
        sa = str(deploy["spec"]["template"]["spec"]["serviceAccountName"])
        rel.operator_kubeconfig = str(
            service_account_kubeconfig(
                rel.kubeconfig, core, namespace, sa, tmp.mktemp("operator-sa")
            )
        )
        rel.probe_namespace = f"{name}-probe"
        core.create_namespace(
            {"metadata": {"name": rel.probe_namespace, "labels": {RELEASE_LABEL: name}}}  # type: ignore[arg-type]  # the client takes dict bodies
        )
        rel.start()
        yield rel
    finally:
        _teardown(rel, helm, name, base, cluster.api)

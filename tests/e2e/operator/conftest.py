"""The DynamICCL chart installed with helm; the operator running as a local process.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing import builders
from dynamiccl.testing.ports import free_port
from dynamiccl.testing.waiting import wait_for
from tests.chart_releases import drop_other_releases_policies

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "dynamiccl"
RELEASE_LABEL = "e2e.dynamiccl.io/release"  # test-only namespace label
NTP = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
PT = ("kubeflow.org", "v1", "pytorchjobs")
MPI = ("kubeflow.org", "v1", "mpijobs")
TR = ("dynamiccl.io", "v1alpha1", "tuningruns")
POD_TIMEOUT = 120
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
        return _arg(self.chart_args, "--webhook-config")

    @property
    def tls_secret(self) -> str:
        return _arg(self.chart_args, "--tls-secret")

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


# ----------------------------------------------------------------------------- jobs
def _container(name: str, gpus: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    ct: dict[str, Any] = {
        "name": name,
        "image": "example.invalid/train:1",
        "command": ["torchrun", "/workspace/train.py"],
        "resources": {"limits": {c.RESOURCE_GPU: str(gpus)}} if gpus else {},
    }
    if env:
        ct["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return ct


def _template(ct: dict[str, Any], node_selector: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [ct]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"spec": spec}


def pytorchjob(
    name: str,
    annotations: dict[str, str],
    *,
    workers: int = 1,
    gpus: int = 8,
    env: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    ct = builders.container(gpus=gpus, env=env, command=["torchrun", "/workspace/train.py"])
    return builders.pytorchjob(
        name,
        annotations=annotations,
        workers=workers,
        pod=builders.template(ct, node_selector=node_selector),
        nproc_per_node=str(gpus or 1),
        restart_policy="OnFailure",
    )


def mpijob(name: str, annotations: dict[str, str], *, workers: int = 2) -> dict[str, Any]:
    launcher = _container("launcher", 0)
    launcher["command"] = ["mpirun", "-n", str(8 * workers), "python", "/workspace/train.py"]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "slotsPerWorker": 8,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": _template(launcher, None)},
                "Worker": {
                    "replicas": workers,
                    "template": _template(_container("worker", 8), None),
                },
            },
        },
    }


def create(release: Release, ns: str, plural: tuple[str, str, str], job: dict[str, Any]) -> Any:
    return k8s.CustomObjectsApi(release.api).create_namespaced_custom_object(
        plural[0], plural[1], ns, plural[2], job
    )


def pods_of(release: Release, ns: str, job: str) -> list[Any]:
    core = k8s.CoreV1Api(release.api)
    sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={job}"
    return list(core.list_namespaced_pod(ns, label_selector=sel).items)


def running_pods(release: Release, ns: str, job: str, count: int) -> list[Any]:
    def ready() -> list[Any]:
        pods = pods_of(release, ns, job)
        ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
        return pods if ok else []

    return list(wait_for(f"{count} Running pods of {job}", ready, POD_TIMEOUT))


def tuning_run(release: Release, ns: str, job: str) -> dict[str, Any]:
    obj = k8s.CustomObjectsApi(release.api).get_namespaced_custom_object(
        *TR[:2], ns, TR[2], f"{job}-dynamiccl"
    )
    return dict(cast(dict[str, Any], obj))  # the custom-objects API returns the object's JSON


def scheduled_run(release: Release, ns: str, job: str) -> dict[str, Any]:
    """The TuningRun once refined from the bound pods, spec and status: the operator writes
    the spec, then the status (two requests), so a read between them pairs the refined
    spec with the previous pass's conditions (Scheduled=False)."""

    def refined() -> dict[str, Any] | None:
        tr = tuning_run(release, ns, job)
        conds = {x["type"]: x["status"] for x in (tr.get("status") or {}).get("conditions", [])}
        scheduled = tr["spec"].get("features", {}).get("scheduled")
        return tr if scheduled and conds.get("Scheduled") == "True" else None

    return dict(wait_for(f"TuningRun of {job} refined from its pods' nodes", refined, 90))


def gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def assert_untouched(pod: Any) -> None:
    assert not [i.name for i in pod.spec.init_containers or [] if i.name.startswith("dynamiccl")]
    assert not [v.name for v in pod.spec.volumes or [] if v.name.startswith("dynamiccl")]
    for ct in pod.spec.containers:
        names = {e.name for e in ct.env or []}
        assert c.ENV_NCCL_TUNER_PLUGIN not in names
        assert "NCCL_NTHREADS" not in names
    assert not [k for k in pod.metadata.annotations or {} if k.startswith(c.GROUP)]


def _arg(args: list[str], flag: str) -> str:
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise KeyError(flag)


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
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


@pytest.fixture(scope="session")
def release(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    helm, kubectl = tool(cluster, "helm"), tool(cluster, "kubectl")
    name = f"dcl-{uuid.uuid4().hex[:6]}"
    namespace = f"{name}-system"
    kubeconfig = str(cluster.kubeconfig)
    port = free_port()
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
    base = ["--kubeconfig", kubeconfig, "-n", namespace]
    rel: Release | None = None
    custom, core = k8s.CustomObjectsApi(cluster.api), k8s.CoreV1Api(cluster.api)
    try:
        try:  # a failed install may still have created objects: the finally removes them
            drop_other_releases_policies(cluster.api, name)
            _run([helm, "install", name, str(CHART), *base, "--create-namespace", "-f", f.name])
        finally:
            os.unlink(f.name)
        manifest = _run([helm, "get", "manifest", name, *base]).stdout
        deploy = chart_deployment(manifest, "operator")
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        rel = Release(
            name=name,
            namespace=namespace,
            kubeconfig=kubeconfig,
            api=cluster.api,
            helm=helm,
            kubectl=kubectl,
            port=port,
            metrics_port=free_port(),
            chart_args=list(container["args"]),
            image=str(container["image"]),
            manifest=manifest,
            log_path=tmp_path_factory.mktemp("operator") / "operator.log",
        )
        rel.policy = name
        custom.create_cluster_custom_object(
            *NTP,
            {
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
            },
        )
        sa = str(deploy["spec"]["template"]["spec"]["serviceAccountName"])
        rel.operator_kubeconfig = str(
            service_account_kubeconfig(
                kubeconfig, core, namespace, sa, tmp_path_factory.mktemp("operator-sa")
            )
        )
        rel.probe_namespace = f"{name}-probe"
        core.create_namespace(
            {"metadata": {"name": rel.probe_namespace, "labels": {RELEASE_LABEL: name}}}  # type: ignore[arg-type]  # the client takes dict bodies
        )
        rel.start()
        yield rel
    finally:
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
        for ns in (namespace, f"{name}-probe"):
            try:
                core.delete_namespace(ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def tuned_namespace(namespace: str, release: Release) -> str:
    """The test's namespace, labelled so that this release's webhook and policy see it."""
    k8s.CoreV1Api(release.api).patch_namespace(
        namespace, {"metadata": {"labels": {RELEASE_LABEL: release.name}}}
    )
    return namespace


_RELEASE_KEY = pytest.StashKey[Release]()


@pytest.fixture(autouse=True)
def _remember_release(request: pytest.FixtureRequest) -> None:
    if "release" in request.fixturenames:
        request.node.stash[_RELEASE_KEY] = request.getfixturevalue("release")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    rel = item.stash.get(_RELEASE_KEY, None)
    if rel is not None and report.failed and call.when in ("setup", "call"):
        report.sections.append((f"operator log (last {LOG_TAIL} lines)", rel.log_tail()))
    return report

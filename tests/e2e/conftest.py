"""Fixtures for end-to-end tests against a real control plane.

Cluster selection (once per session):
  1. $DYNAMICCL_KUBECONFIG, else $KUBECONFIG, if it points to a reachable API
     server: use that cluster (hack/cluster-up.sh, kind, ...). Nothing is
     started or stopped.
  2. Otherwise run hack/cluster-up.sh (local etcd + kube-apiserver + ... + kwok
     + training operator; idempotent). If that cluster was not running before,
     hack/cluster-down.sh stops it at the end of the session unless
     DYNAMICCL_KEEP_CLUSTER=1.

Every test gets its own namespace from the ``namespace`` fixture. When a test
fails, the tail of each component log of the local cluster (if any) and the
namespace's pods and events are attached to the failure report.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK_DIR = REPO_ROOT / "hack"
LOG_TAIL_LINES = 40

kubernetes = pytest.importorskip("kubernetes", reason="python 'kubernetes' client not installed")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "dynamiccl" / "v1"
    return Path(os.environ.get("DYNAMICCL_CACHE", str(default)))


def _cluster_dir() -> Path:
    return Path(os.environ.get("DYNAMICCL_CLUSTER_DIR", str(_cache_dir() / "cluster")))


@dataclass
class Cluster:
    kubeconfig: Path
    api: k8s.ApiClient
    started_here: bool
    log_dir: Path | None  # component logs of a hack/cluster-up.sh cluster

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)


def _reachable(kubeconfig: Path) -> k8s.ApiClient | None:
    if not kubeconfig.is_file():
        return None
    try:
        api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig)
        )
        k8s.VersionApi(api).get_code(_request_timeout=5)
    except Exception:
        return None
    return api


def _log_dir_for(kubeconfig: Path) -> Path | None:
    logs = kubeconfig.parent / "logs"
    return logs if logs.is_dir() else None


def _env_kubeconfig() -> Path | None:
    for var in ("DYNAMICCL_KUBECONFIG", "KUBECONFIG"):
        value = os.environ.get(var, "")
        if value:
            # KUBECONFIG may be a list; the first file is the one we talk to.
            return Path(value.split(os.pathsep)[0]).expanduser()
    return None


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    env_kcfg = _env_kubeconfig()
    if env_kcfg is not None:
        api = _reachable(env_kcfg)
        if api is not None:
            yield Cluster(env_kcfg, api, started_here=False, log_dir=_log_dir_for(env_kcfg))
            return

    # A hack/cluster-up.sh cluster that is already running (another session's)
    # is completed if needed but never stopped by us.
    default_kcfg = _cluster_dir() / "kubeconfig"
    was_running = _reachable(default_kcfg) is not None

    proc = subprocess.run(
        ["bash", str(HACK_DIR / "cluster-up.sh")],
        check=False,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"hack/cluster-up.sh failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    kubeconfig = Path(proc.stdout.strip().splitlines()[-1])
    api = _reachable(kubeconfig)
    if api is None:
        pytest.fail(f"cluster-up.sh finished but {kubeconfig} is not reachable", pytrace=False)
    try:
        log_dir = _cluster_dir() / "logs"
        yield Cluster(kubeconfig, api, started_here=not was_running, log_dir=log_dir)
    finally:
        if not was_running and os.environ.get("DYNAMICCL_KEEP_CLUSTER") != "1":
            subprocess.run(["bash", str(HACK_DIR / "cluster-down.sh")], check=False, timeout=120)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; deleted afterwards (without waiting)."""
    base = request.node.name.lower().replace("_", "-")
    base = "".join(c for c in base if c.isalnum() or c == "-").strip("-")[:40].rstrip("-")
    name = f"e2e-{base}-{uuid.uuid4().hex[:6]}"
    core = cluster.core()
    core.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={"dynamiccl.io/e2e": "true"}))
    )
    request.node.stash[_NAMESPACE_KEY] = name
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name, propagation_policy="Background")
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise


_NAMESPACE_KEY = pytest.StashKey[str]()
_CLUSTER_KEY = pytest.StashKey[Cluster]()


@pytest.fixture(autouse=True)
def _remember_cluster(request: pytest.FixtureRequest) -> None:
    # Only tests that use the cluster get failure diagnostics.
    if "cluster" in request.fixturenames:
        request.node.stash[_CLUSTER_KEY] = request.getfixturevalue("cluster")


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


def _diagnostics(item: pytest.Item) -> list[tuple[str, str]]:
    sections: list[tuple[str, str]] = []
    cl = item.stash.get(_CLUSTER_KEY, None)
    if cl is None:
        return sections
    ns = item.stash.get(_NAMESPACE_KEY, None)
    if ns:
        try:
            core = cl.core()
            pods: list[Any] = core.list_namespaced_pod(ns, _request_timeout=10).items
            lines = [
                f"{p.metadata.name}: phase={p.status.phase} node={p.spec.node_name}" for p in pods
            ]
            events = core.list_namespaced_event(ns, _request_timeout=10).items
            lines += [
                f"event {e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}"
                for e in events
            ]
            sections.append((f"namespace {ns}", "\n".join(lines) or "<no pods, no events>"))
        except Exception as exc:
            sections.append((f"namespace {ns}", f"<cannot list: {exc}>"))
    if cl.log_dir is not None and cl.log_dir.is_dir():
        for log in sorted(cl.log_dir.glob("*.log")):
            title = f"{log.name} (last {LOG_TAIL_LINES} lines)"
            sections.append((title, _tail(log, LOG_TAIL_LINES)))
    return sections


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if report.failed and call.when in ("setup", "call"):
        for title, text in _diagnostics(item):
            report.sections.append((title, text))
    return report

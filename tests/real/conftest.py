"""Fixtures of the `real` tier: real containers on the real node (hack/real-node.sh).

The session runs ``hack/cluster-up.sh --real-node`` (idempotent: the control plane,
the kwok nodes and the real node; it builds the images with hack/images.sh and
imports them into the node's containerd) and leaves the cluster running at the
end (``make cluster-down`` stops it). The tier needs root (containerd, network
namespaces, iptables); elsewhere it is skipped.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK_DIR = REPO_ROOT / "hack"
NODE_NAME = "real-node-0"
NODE_LABEL = "dynamiccl.io/real-node"
# what a pod needs to land on the real node (and only there)
ON_REAL_NODE: dict[str, object] = {
    "nodeSelector": {NODE_LABEL: "true"},
    "tolerations": [{"key": NODE_LABEL, "operator": "Exists"}],
}

kubernetes = pytest.importorskip("kubernetes", reason="python 'kubernetes' client not installed")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "dynamiccl" / "v1"
    return Path(os.environ.get("DYNAMICCL_CACHE", str(default)))


def _cluster_dir() -> Path:
    return Path(os.environ.get("DYNAMICCL_CLUSTER_DIR", str(_cache_dir() / "cluster")))


def _read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value.strip('"')
    return env


@dataclass
class RealCluster:
    kubeconfig: Path
    api: k8s.ApiClient
    helm: Path
    node_dir: Path
    image_repository: str
    image_tag: str

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def helm_run(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run(
            [str(self.helm), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stderr}"
        return out.stdout


@pytest.fixture(scope="session")
def real_cluster() -> RealCluster:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, network namespaces, iptables)")
    # DYNAMICCL_REAL_REUSE_IMAGES=1: the images last built (no rebuild for a source
    # change; for iterating on the tests themselves)
    steps = [["bash", str(HACK_DIR / "cluster-up.sh"), "--real-node"]]
    if os.environ.get("DYNAMICCL_REAL_REUSE_IMAGES") == "1":
        steps = [
            ["bash", str(HACK_DIR / "cluster-up.sh")],
            ["bash", str(HACK_DIR / "real-node.sh"), "up", "--no-build"],
        ]
    for cmd in steps:
        up = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        assert up.returncode == 0, f"{' '.join(cmd[1:])} failed:\n{up.stderr[-4000:]}"
    cluster_dir = _cluster_dir()
    kubeconfig = cluster_dir / "kubeconfig"
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    images = _read_env(_cache_dir() / "images" / "images.env")
    return RealCluster(
        kubeconfig=kubeconfig,
        api=api,
        helm=cluster_dir / "bin" / "helm",
        node_dir=cluster_dir / "node",
        image_repository=images["DYNAMICCL_IMAGE_REPOSITORY"],
        image_tag=images["DYNAMICCL_IMAGE_TAG"],
    )


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, interval: float = 1.0
) -> float:
    """Poll `check` until true; the seconds it took. Fails with `what` on timeout."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start

"""The chart on the real node for the real-node demo: lock, images, helm install, clean-up.

`hack/real-node.sh` runs a real kubelet node, `real-node-0`, next to the kwok
nodes. The chart's cluster-scoped objects (webhook, ClusterRoles) and the
operator that watches every namespace exist once per cluster, and the real test
tier installs the same chart there: both take the real-tier lock
(`<cluster dir>/real-tier.lock`, `tests/real/conftest.py`) for as long as they
use the node, and the demo uninstalls its release before it lets go of it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.testing.real_manifests import NODE_NAME, chart_values
from dynamiccl.testing.real_node_sessions import RELEASE, SESSION_LABELS

REPO: Final = Path(__file__).resolve().parents[2]
SYSTEM_NS: Final = "dcl-demo-real"  # the release (Pod Security restricted)
AGENT_NS: Final = "dcl-demo-real-node"  # the node agent reads the host's /sys: privileged
JOBS_NS: Final = "dcl-demo-real-jobs"  # the training jobs (restricted)
NS_LABEL: Final = "dynamiccl-demo-real"  # what the demo's policy selects
STORAGE_CLASS: Final = "dynamiccl-real-local"
# the retraining Job on a 2-core node next to the chart's pods (the 2-CPU default does not
# fit); a 5 s loop so that the story does not wait on the loop's ticks
LEARNING: Final = {"learning.cpu": "1", "learning.memory": "2Gi", "learning.interval": "5"}

Say = Callable[[str], None]


def read_env(path: Path) -> dict[str, str]:
    """A shell-sourceable KEY=value file (hack/images.sh's images.env)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value.strip('"')
    return env


def other_releases(cl: Any) -> list[str]:
    """Other releases of the chart in the cluster (by their admission policy bindings): their
    `<release>-job-config` policy refuses this release's operator every job's ConfigMap."""
    adm = cl.admission
    items = adm.list_validating_admission_policy_binding(label_selector=c.CHART_SELECTOR).items
    names = {(b.metadata.labels or {}).get(c.LABEL_INSTANCE, "") for b in items}
    return sorted(n for n in names if n and n != RELEASE)


def node_up(cache: Path, reuse_images: bool, say: Say) -> dict[str, str]:
    """The real node with the product and trainer images in its containerd (built if the tree
    changed, unless `reuse_images`); the images' references."""
    cmd = ["bash", str(REPO / "hack" / "real-node.sh"), "up", "--with-trainer"]
    if reuse_images:
        cmd.append("--no-build")
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"hack/real-node.sh up failed:\n{out.stderr[-3000:]}")
    say(f"real node up, images imported ({time.monotonic() - t0:.0f} s)")
    return read_env(cache / "images" / "images.env")


def local_store(cl: Any, ns: str, volume: Path) -> None:
    """A StorageClass without provisioner and a local PersistentVolume on the real node at
    `volume` for release namespace `ns`'s store (its claim `<release>-store`); the real
    tier's and this demo's. `cl`: a `testing.kubectl.Cluster`."""
    sc = {
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    try:
        cl.storage.create_storage_class(sc)
    except cl.api_error as exc:
        if getattr(exc, "status", None) != 409:  # 409: there already
            raise
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
    cl.core.create_persistent_volume({
        "metadata": {"name": f"{ns}-store", "labels": dict(SESSION_LABELS)},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "claimRef": {"namespace": ns, "name": f"{RELEASE}-store"},
            "local": {"path": str(volume)},
            "nodeAffinity": {
                "required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}
            },
        },
    })  # fmt: skip


@dataclass
class RealRelease:
    """The demo's release of the chart on the real node."""

    cl: Any  # dynamiccl.testing.kubectl.Cluster
    node_dir: Path
    out: Path

    @property
    def volume(self) -> Path:
        return self.node_dir / "volumes" / SYSTEM_NS

    def helm(self, *args: str) -> str:
        return str(self.cl.sh(self.cl.helm, "--kubeconfig", self.cl.kubeconfig, *args))

    def install(self, images: dict[str, str], say: Say) -> None:
        self.remove()
        core = self.cl.core
        ps = ("enforce", "warn", "audit")
        for ns, level, extra in (
            (SYSTEM_NS, "restricted", {}),
            (AGENT_NS, "privileged", {}),
            (JOBS_NS, "restricted", {NS_LABEL: "jobs"}),
        ):
            labels = {f"pod-security.kubernetes.io/{m}": level for m in ps} | extra
            labels |= SESSION_LABELS
            core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        self.volume.mkdir(parents=True)
        local_store(self.cl, SYSTEM_NS, self.volume)
        values = self.out / "values.json"
        values.write_text(
            json.dumps(
                chart_values(
                    images["DYNAMICCL_IMAGE_REPOSITORY"],
                    images["DYNAMICCL_IMAGE_TAG"],
                    AGENT_NS,
                    STORAGE_CLASS,
                )
            )
        )
        sets = [a for k, v in LEARNING.items() for a in ("--set", f"{k}={v}")]
        t0 = time.monotonic()
        chart = str(REPO / "charts" / "dynamiccl")
        self.helm("install", RELEASE, chart, "-n", SYSTEM_NS, "-f", str(values), *sets)
        self._wait_ready()
        say(f"helm install {RELEASE} on {NODE_NAME}: operator, ingest, node agent Ready "
            f"in {time.monotonic() - t0:.0f} s")  # fmt: skip

    def _wait_ready(self) -> None:
        apps = self.cl.apps

        def available(name: str) -> bool:
            d = apps.read_namespaced_deployment(name, SYSTEM_NS)
            return bool((d.status.available_replicas or 0) >= (d.spec.replicas or 1))

        def agent() -> bool:
            ds = apps.read_namespaced_daemon_set(f"{RELEASE}-node-agent", AGENT_NS)
            return bool(ds.status.desired_number_scheduled == 1 and ds.status.number_ready == 1)

        self.cl.wait("the operator", lambda: available(f"{RELEASE}-operator"), 300)
        self.cl.wait("the ingest", lambda: available(f"{RELEASE}-ingest"), 300)
        self.cl.wait("the node agent", agent, 300)

    def keep_evidence(self) -> None:
        """The store (through SQLite's backup API: the WAL too) and the model versions."""
        import sqlite3  # noqa: PLC0415

        db = self.volume / "experience.db"
        if db.exists():
            with sqlite3.connect(db) as src, sqlite3.connect(self.out / "store.sqlite") as dst:
                src.backup(dst)
        if (self.volume / "models").is_dir():
            shutil.copytree(self.volume / "models", self.out / "models", dirs_exist_ok=True)

    def remove(self) -> None:
        """Uninstall the release and delete what the demo created (idempotent)."""
        ApiException = self.cl.api_error  # noqa: N806 - the client's exception class
        with contextlib.suppress(RuntimeError, subprocess.CalledProcessError):
            self.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s")
        core = self.cl.core
        for ns in (JOBS_NS, SYSTEM_NS, AGENT_NS):
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(f"{SYSTEM_NS}-store")
        with contextlib.suppress(ApiException):
            self.cl.custom.delete_cluster_custom_object(
                "dynamiccl.io", "v1alpha1", "nodetopologies", NODE_NAME
            )

        def gone() -> bool:
            names = {n.metadata.name for n in core.list_namespace().items}
            return not names & {JOBS_NS, SYSTEM_NS, AGENT_NS}

        self.cl.wait("the demo's namespaces to go", gone, 300)
        shutil.rmtree(self.volume, ignore_errors=True)

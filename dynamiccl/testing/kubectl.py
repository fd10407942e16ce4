"""The local control plane as the cluster tests, tools and `make demo-cluster` drive it.

`Cluster`: the apiserver through the kubernetes client (its typed APIs, the error a refused
call raises), plus the helm and kubectl binaries the build put in the bin directory, a
ServiceAccount token for a pod (TokenRequest) and a poll until something holds. One client for
`tests/real`, `tests/e2e` and the demo's two cluster modes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dynamiccl import constants as c
from dynamiccl.kubeclient import api_client


class Cluster:
    """The apiserver through the kubernetes client, helm and kubectl binaries."""

    def __init__(self, kubeconfig: str, bin_dir: Path) -> None:
        from kubernetes import client  # noqa: PLC0415 - heavy, only here
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.core: Any = client.CoreV1Api(self.api)  # dynamic client shapes: Any
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.batch: Any = client.BatchV1Api(self.api)
        self.storage: Any = client.StorageV1Api(self.api)
        self.admission: Any = client.AdmissionregistrationV1Api(self.api)
        self.api_error: type[Exception] = ApiException  # what a refused call raises
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

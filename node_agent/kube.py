"""The node agent's only contact with Kubernetes (the only module importing ``kubernetes``).

Reads: the Node's labels and the node's NodeTopology object. Writes: create
the NodeTopology, replace its status, patch DynamICCL's node labels. The
RBAC these need is in docs/node-agent.md.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Protocol

from dynamiccl.api import node_topology as nt
from dynamiccl.constants import API_VERSION, GROUP
from dynamiccl.kubeclient import REQUEST_TIMEOUT_S, api_client


class KubeError(RuntimeError):
    """An API call failed; the message names the call and the status."""


class TopologyApi(Protocol):
    """What the agent loop needs from the cluster (counted/faked at this layer in tests)."""

    def get_node_labels(self, name: str) -> dict[str, str] | None: ...
    def get_topology(self, name: str) -> dict[str, Any] | None: ...
    def create_topology(self, body: dict[str, Any]) -> None: ...
    def replace_topology_status(self, name: str, status: dict[str, Any]) -> None: ...
    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> None: ...


class KubeAdapter:
    """TopologyApi over the official Python client."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client as k8s_client  # noqa: PLC0415 - heavy, load on use

        client: Any = k8s_client
        api = api_client(kubeconfig)
        self._api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._exc: type[Exception] = client.ApiException

    def _call(self, what: str, fn: Any, *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        """Run one API call; 404 -> None when ``missing_ok``, any failure -> KubeError."""
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT_S, **kw)
        except self._exc as exc:
            status = getattr(exc, "status", None)
            if missing_ok and status == 404:
                return None
            detail = getattr(exc, "reason", "") or ""
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(getattr(exc, "body", "") or "{}").get("message") or detail
            raise KubeError(f"{what}: HTTP {status}: {detail}".rstrip(": ")) from exc
        except Exception as exc:  # urllib3/ssl/socket errors: the server is not reachable
            raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def get_node_labels(self, name: str) -> dict[str, str] | None:
        node = self._call(f"get node {name}", self._core.read_node, name, missing_ok=True)
        if node is None:
            return None
        meta = node.metadata
        return dict((meta.labels if meta is not None else None) or {})

    def get_topology(self, name: str) -> dict[str, Any] | None:
        obj = self._call(
            f"get {nt.PLURAL}/{name}",
            self._custom.get_cluster_custom_object,
            GROUP,
            API_VERSION,
            nt.PLURAL,
            name,
            missing_ok=True,
        )
        return dict(obj) if isinstance(obj, dict) else None

    def create_topology(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self._call(
            f"create {nt.PLURAL}/{name}",
            self._custom.create_cluster_custom_object,
            GROUP,
            API_VERSION,
            nt.PLURAL,
            body,
        )

    def replace_topology_status(self, name: str, status: dict[str, Any]) -> None:
        # JSON patch "add" replaces the whole status: keys that disappeared are gone.
        body = [{"op": "add", "path": "/status", "value": status}]
        self._call(
            f"patch {nt.PLURAL}/{name}/status",
            self._custom.patch_cluster_custom_object_status,
            GROUP,
            API_VERSION,
            nt.PLURAL,
            name,
            body,
            _content_type="application/json-patch+json",
        )

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> None:
        body = {"metadata": {"labels": labels}}
        self._call(
            f"patch node {name} labels",
            self._core.patch_node,
            name,
            body,
            _content_type="application/merge-patch+json",
        )

    def close(self) -> None:
        self._api.close()

"""The node agent's only contact with Kubernetes (the only module importing ``kubernetes``).

Reads: the Node's labels and the node's NodeTopology object. Writes: create
the NodeTopology, replace its status, patch DynamICCL's node labels. The
RBAC these need is in docs/node-agent.md.
"""

from __future__ import annotations

from typing import Any, Protocol

from dynamiccl.api import node_topology as nt
from dynamiccl.constants import API_VERSION, GROUP


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
        from kubernetes import config as k8s_config  # noqa: PLC0415

        client: Any = k8s_client
        config: Any = k8s_config
        if kubeconfig:
            api = config.new_client_from_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.ApiClient()
        self._api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._exc: type[Exception] = client.ApiException

    def _fail(self, what: str, exc: Exception) -> KubeError:
        status = getattr(exc, "status", "?")
        reason = getattr(exc, "reason", str(exc))
        return KubeError(f"{what}: HTTP {status} {reason}")

    def get_node_labels(self, name: str) -> dict[str, str] | None:
        try:
            node = self._core.read_node(name)
        except self._exc as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._fail(f"get node {name}", exc) from exc
        meta = node.metadata
        return dict((meta.labels if meta is not None else None) or {})

    def get_topology(self, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self._custom.get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, name)
        except self._exc as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._fail(f"get {nt.PLURAL}/{name}", exc) from exc
        return dict(obj) if isinstance(obj, dict) else None

    def create_topology(self, body: dict[str, Any]) -> None:
        try:
            self._custom.create_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, body)
        except self._exc as exc:
            raise self._fail(f"create {nt.PLURAL}/{body['metadata']['name']}", exc) from exc

    def replace_topology_status(self, name: str, status: dict[str, Any]) -> None:
        # JSON patch "add" replaces the whole status: keys that disappeared are gone.
        body = [{"op": "add", "path": "/status", "value": status}]
        try:
            self._custom.patch_cluster_custom_object_status(
                GROUP, API_VERSION, nt.PLURAL, name, body
            )
        except self._exc as exc:
            raise self._fail(f"patch {nt.PLURAL}/{name}/status", exc) from exc

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> None:
        try:
            self._core.patch_node(name, {"metadata": {"labels": labels}})
        except self._exc as exc:
            raise self._fail(f"patch node {name} labels", exc) from exc

    def close(self) -> None:
        self._api.close()

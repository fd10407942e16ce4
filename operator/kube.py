"""The operator's ONLY adapter to the Kubernetes API (the ``kubernetes`` client lives here).

Everything returns/accepts plain dicts (the wire form), so the rest of the
operator stays pure and testable without a cluster. Blocking calls: async code
runs them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch

from dynamiccl.kubeclient import CONTROL_TIMEOUT_S, api_client

# The client's own annotations are partial; we wrap it and type our side instead.
client: Any = _client
config: Any = _config
watch: Any = _watch
ApiException: Any = _client.exceptions.ApiException

log = logging.getLogger("dynamiccl.operator.kube")


class NotFoundError(LookupError):
    """The object does not exist."""


class ConflictError(RuntimeError):
    """The object already exists / changed under us."""


@dataclass(frozen=True)
class Resource:
    """API coordinates of a resource type (group "" = core)."""

    group: str
    version: str
    plural: str
    namespaced: bool = True
    method: str = ""  # core client method suffix, e.g. config_map (default: plural[:-1])

    @property
    def snake(self) -> str:
        """Name used in the core client's method names."""
        return self.method or self.plural[:-1]


class Patcher(Protocol):
    """What code that patches objects needs of `Kube` (the in-memory fakes of the tests
    satisfy it too): a JSON merge patch, of the status subresource when ``status``."""

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]: ...


CONFIGMAPS = Resource("", "v1", "configmaps", method="config_map")
PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
SECRETS = Resource("", "v1", "secrets")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")


def _err(exc: Any, what: str) -> Exception:
    if exc.status == 404:
        return NotFoundError(what)
    if exc.status == 409:
        return ConflictError(what)
    return RuntimeError(f"{what}: {exc.status} {exc.reason}")


class Kube:
    """A thin, dict-in/dict-out Kubernetes client."""

    def __init__(self, kubeconfig: str | None = None, timeout: float = CONTROL_TIMEOUT_S) -> None:
        if kubeconfig:
            # kopf's login_via_client loads the default kubeconfig itself: point it at the
            # same file (the client resolves $KUBECONFIG once, at import time).
            _config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig
        # One connection per worker thread: no TLS re-handshakes.
        self.api = api_client(kubeconfig, pool_maxsize=32)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.admission = client.AdmissionregistrationV1Api(self.api)
        self.timeout = timeout

    def _san(self, obj: Any) -> dict[str, Any]:
        out = self.api.sanitize_for_serialization(obj)
        return out if isinstance(out, dict) else {}

    @staticmethod
    def _raw(resp: Any) -> dict[str, Any]:
        """The JSON body of an un-deserialised response (``_preload_content=False``).

        Core resources are read this way: the client's model classes would turn the
        wire JSON into objects and ``_san`` back into dicts, costing more CPU than the
        rest of a reconcile (a Node list is thousands of objects).
        """
        out = json.loads(resp.data or b"{}")
        return out if isinstance(out, dict) else {}

    # --- generic get/list/create/replace/patch over core and custom resources ---------
    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """One object (NotFoundError if absent)."""
        try:
            if res.group:
                if res.namespaced:
                    return dict(
                        self.custom.get_namespaced_custom_object(
                            res.group,
                            res.version,
                            namespace,
                            res.plural,
                            name,
                            _request_timeout=self.timeout,
                        )
                    )
                return dict(
                    self.custom.get_cluster_custom_object(
                        res.group, res.version, res.plural, name, _request_timeout=self.timeout
                    )
                )
            kind = res.snake
            fn = getattr(self.core, f"read_namespaced_{kind}" if res.namespaced else f"read_{kind}")
            args = (name, namespace) if res.namespaced else (name,)
            return self._raw(fn(*args, _request_timeout=self.timeout, _preload_content=False))
        except ApiException as exc:
            raise _err(exc, f"{res.plural}/{name}") from exc

    def list(
        self, res: Resource, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of a type (all namespaces when ``namespace`` is None)."""
        return list(self._list(res, namespace, label_selector).get("items") or [])

    def _list(
        self, res: Resource, namespace: str | None, label_selector: str, **kw: Any
    ) -> dict[str, Any]:
        if res.group:
            if res.namespaced and namespace:
                return dict(
                    self.custom.list_namespaced_custom_object(
                        res.group,
                        res.version,
                        namespace,
                        res.plural,
                        label_selector=label_selector,
                        **kw,
                    )
                )
            return dict(
                self.custom.list_cluster_custom_object(
                    res.group, res.version, res.plural, label_selector=label_selector, **kw
                )
            )
        kind = res.snake
        kw = {"label_selector": label_selector, "_preload_content": False, **kw}
        if res.namespaced and namespace:
            out = getattr(self.core, f"list_namespaced_{kind}")(namespace, **kw)
        elif res.namespaced:
            out = getattr(self.core, f"list_{kind}_for_all_namespaces")(**kw)
        else:
            out = getattr(self.core, f"list_{kind}")(**kw)
        return self._raw(out)

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create (ConflictError if it exists)."""
        ns = (body.get("metadata") or {}).get("namespace")
        try:
            if res.group:
                if res.namespaced:
                    return dict(
                        self.custom.create_namespaced_custom_object(
                            res.group, res.version, ns, res.plural, dict(body)
                        )
                    )
                return dict(
                    self.custom.create_cluster_custom_object(
                        res.group, res.version, res.plural, dict(body)
                    )
                )
            kind = res.snake
            fn = getattr(
                self.core, f"create_namespaced_{kind}" if res.namespaced else f"create_{kind}"
            )
            args = (ns, dict(body)) if res.namespaced else (dict(body),)
            return self._raw(fn(*args, _preload_content=False))
        except ApiException as exc:
            raise _err(exc, f"{res.plural}/{(body.get('metadata') or {}).get('name')}") from exc

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """JSON merge patch (of the status subresource when ``status``)."""
        try:
            if res.group:
                if res.namespaced:
                    fn = (
                        self.custom.patch_namespaced_custom_object_status
                        if status
                        else self.custom.patch_namespaced_custom_object
                    )
                    return dict(
                        fn(res.group, res.version, namespace, res.plural, name, dict(patch))
                    )
                fn = (
                    self.custom.patch_cluster_custom_object_status
                    if status
                    else self.custom.patch_cluster_custom_object
                )
                return dict(fn(res.group, res.version, res.plural, name, dict(patch)))
            kind = res.snake
            sfx = "_status" if status else ""
            if res.namespaced:
                out = getattr(self.core, f"patch_namespaced_{kind}{sfx}")(
                    name, namespace, dict(patch), _preload_content=False
                )
            else:
                out = getattr(self.core, f"patch_{kind}{sfx}")(
                    name, dict(patch), _preload_content=False
                )
            return self._raw(out)
        except ApiException as exc:
            raise _err(exc, f"{res.plural}/{name}") from exc

    def delete(self, res: Resource, name: str, namespace: str | None = None) -> None:
        """Delete (absent is fine)."""
        try:
            if res.group:
                if res.namespaced:
                    self.custom.delete_namespaced_custom_object(
                        res.group, res.version, namespace, res.plural, name
                    )
                else:
                    self.custom.delete_cluster_custom_object(
                        res.group, res.version, res.plural, name
                    )
                return
            kind = res.snake
            if res.namespaced:
                getattr(self.core, f"delete_namespaced_{kind}")(name, namespace)
            else:
                getattr(self.core, f"delete_{kind}")(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- specifics ------------------------------------------------------------------
    def event(self, body: Mapping[str, Any]) -> None:
        """Record a core/v1 Event (best effort: failures are logged, never raised)."""
        try:
            self.core.create_namespaced_event(body["metadata"]["namespace"], dict(body))
        except (ApiException, KeyError) as exc:
            log.warning("could not record event: %s", exc)

    def patch_webhook_ca(self, name: str, ca_pem_b64: str) -> bool:
        """Set caBundle on every webhook of a MutatingWebhookConfiguration; False if absent."""
        try:
            mwc = self.admission.read_mutating_webhook_configuration(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        hooks = [
            {"name": h.name, "clientConfig": {"caBundle": ca_pem_b64}} for h in mwc.webhooks or []
        ]
        if all((h.client_config.ca_bundle or "") == ca_pem_b64 for h in mwc.webhooks or []):
            return True
        self.admission.patch_mutating_webhook_configuration(name, {"webhooks": hooks})
        return True

    def watch(
        self,
        res: Resource,
        on_event: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
        label_selector: str = "",
    ) -> None:
        """List then watch forever (until ``stop``), calling ``on_event(type, obj)``.

        ``type`` is ADDED/MODIFIED/DELETED; a fresh list after a watch error sends
        SYNC events and a final ``("RESYNCED", {})`` so caches can drop stale keys.
        """
        while not stop.is_set():
            try:
                listing = self._list(res, None, label_selector)
                for obj in listing.get("items") or []:
                    on_event("SYNC", obj)
                on_event("RESYNCED", {})
                rv = (listing.get("metadata") or {}).get("resourceVersion")
                w = watch.Watch()
                fn = self._watch_fn(res)
                for ev in w.stream(
                    fn,
                    label_selector=label_selector,
                    resource_version=rv,
                    timeout_seconds=300,
                    deserialize=False,  # plain dicts, see _raw
                ):
                    if stop.is_set():
                        w.stop()
                        return
                    obj = ev["object"]
                    on_event(ev["type"], obj if isinstance(obj, dict) else self._san(obj))
            except Exception as exc:
                log.info("watch %s restarting: %s", res.plural, exc)
                stop.wait(1.0)

    def _watch_fn(self, res: Resource) -> Callable[..., Any]:
        if res.group:

            def fn(**kw: Any) -> Any:
                return self.custom.list_cluster_custom_object(
                    res.group, res.version, res.plural, **kw
                )

            return fn
        kind = res.snake
        if res.namespaced:
            return getattr(self.core, f"list_{kind}_for_all_namespaces")  # type: ignore[no-any-return]
        return getattr(self.core, f"list_{kind}")  # type: ignore[no-any-return]

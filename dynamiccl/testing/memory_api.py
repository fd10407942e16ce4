"""An in-memory Kubernetes API for tests and tools: objects in a table, with the operator
adapter's get/list/create/patch/delete/event surface (operator/kube.py `Kube`; the learning
loop's slice of it: operator/cluster_api.py `ClusterAPI`).

As the API server does: reads and writes copy (a caller's later edit of an object it got
never changes the stored one); `create` refuses a name taken (ConflictError) and gives the
object a uid (the body's, if it has one) and a creation time from the API's clock; `patch`
is a JSON merge patch (RFC 7386) of the status subresource when ``status``, of the rest of
the object otherwise, and a missing object is NotFoundError. Optimistic concurrency (what
leader election relies on): every write gives the object a new ``metadata.resourceVersion``,
and a patch that carries a resourceVersion other than the stored one is refused
(ConflictError, the API server's 409). Label selectors are equality terms (``a=b,c=d``).
As `Kube` does: `delete` of a missing object is no error, and `event` records a core/v1
Event, here a copy in `events`, in order. Every patch is recorded as (plural, name) in
`patched`.
"""

from __future__ import annotations

import builtins
import copy
import datetime as dt
import json
import uuid
from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.kube import ConflictError, NotFoundError, Resource

_Key = tuple[str, str | None, str]  # (plural, namespace, name)


class Clock:
    """A clock that moves one second at every reading (tests share it with the store)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class MemoryAPI:
    """The in-memory cluster (see the module docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.objs: dict[_Key, dict[str, Any]] = {}
        self.clock = clock or Clock()
        self.patched: list[tuple[str, str]] = []  # (plural, name) of every patch
        self.events: list[dict[str, Any]] = []  # the Events recorded, in order
        self.version = 0  # the last resourceVersion given

    def add(self, res: Resource, obj: dict[str, Any]) -> None:
        """Store ``obj`` as it is (a test's fixture: no uid or timestamp added; a
        resourceVersion if it has none)."""
        meta = obj["metadata"]
        if "resourceVersion" not in meta:
            self._bump(obj)
        self.objs[(res.plural, meta.get("namespace"), meta["name"])] = obj

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return copy.deepcopy(self._stored(res, name, namespace))

    def list(
        self, res: Resource, namespace: str | None = None, label_selector: str = ""
    ) -> builtins.list[dict[str, Any]]:
        want = dict(kv.split("=", 1) for kv in label_selector.split(",") if kv)
        return [
            copy.deepcopy(o)
            for (plural, ns, _), o in sorted(self.objs.items(), key=_order)
            if plural == res.plural
            and (namespace is None or ns == namespace)
            and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
        ]

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(json.dumps(body))
        meta = obj["metadata"]
        if (res.plural, meta.get("namespace"), meta["name"]) in self.objs:
            raise ConflictError(f"{res.plural} {meta['name']} already exists")
        ts = dt.datetime.fromtimestamp(self.clock.t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", ts)
        self._bump(obj)
        self.add(res, obj)
        return copy.deepcopy(obj)

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        obj = self._stored(res, name, namespace)
        body = json.loads(json.dumps(patch))
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != obj["metadata"].get("resourceVersion"):
            raise ConflictError(
                f"{res.plural} {name}: resourceVersion {want} is not the stored one"
            )
        if status:  # the status subresource takes the status alone
            obj["status"] = merge_patch(obj.get("status"), body.get("status", {}))
        else:  # the main resource ignores a status change
            body.pop("status", None)
            merged = merge_patch(obj, body)
            obj.clear()
            obj.update(merged)
        self._bump(obj)
        self.patched.append((res.plural, name))
        return copy.deepcopy(obj)

    def delete(self, res: Resource, name: str, namespace: str | None = None) -> None:
        """Delete the object; a missing one is no error (`Kube.delete` ignores a 404)."""
        self.objs.pop((res.plural, namespace, name), None)

    def event(self, body: Mapping[str, Any]) -> None:
        """Record a core/v1 Event (a copy, in `events`)."""
        self.events.append(json.loads(json.dumps(body)))

    def patches_of(self, res: Resource) -> builtins.list[str]:
        """The names of the objects of ``res`` patched, in order."""
        return [name for plural, name in self.patched if plural == res.plural]

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _stored(self, res: Resource, name: str, namespace: str | None) -> dict[str, Any]:
        obj = self.objs.get((res.plural, namespace, name))
        if obj is None:
            raise NotFoundError(f"{res.plural} {name}")
        return obj


def _order(item: tuple[_Key, Any]) -> tuple[str, str, str]:
    (plural, ns, name), _ = item
    return plural, ns or "", name

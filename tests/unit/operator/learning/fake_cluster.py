"""The learning loop tests' stand-in for the API server: objects in a dict, by
(plural, namespace, name), with the operator adapter's list/create/patch surface
(operator/cluster_api.py `ClusterAPI`).

Reads and writes copy, as the wire does: a caller's later edit of an object it got
never changes the stored one. `create` gives the object a uid and a creation time
from the tests' `Clock`; `patch` merges a status patch (the loop patches only status
subresources) and records (plural, name) in `patched`.
"""

from __future__ import annotations

import builtins
import copy
import datetime as dt
import json
import uuid
from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.kube import NotFoundError, Resource
from dynamiccl.operator.learning.loop import POLICIES


class Clock:
    """A clock that moves one second at every reading (store and loop share it)."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class FakeAPI:
    """The in-memory cluster (see the module docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.objs: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.clock = clock or Clock()
        self.patched: list[tuple[str, str]] = []  # (plural, name) of every patch

    def add(self, res: Resource, obj: dict[str, Any]) -> None:
        self.objs[(res.plural, obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj

    def list(
        self, res: Resource, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
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
        ts = dt.datetime.fromtimestamp(self.clock.t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=ts)
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
        obj = self.objs.get((res.plural, namespace, name))
        if obj is None:
            raise NotFoundError(name)
        assert status
        self.patched.append((res.plural, name))
        obj.setdefault("status", {}).update(json.loads(json.dumps(patch["status"])))
        return copy.deepcopy(obj)

    @property
    def policy_patches(self) -> builtins.list[str]:
        """The names of the NCCLTuningPolicies whose status was patched, in order."""
        return [name for plural, name in self.patched if plural == POLICIES.plural]


def _order(item: tuple[tuple[str, str | None, str], Any]) -> tuple[str, str, str]:
    (plural, ns, name), _ = item
    return plural, ns or "", name

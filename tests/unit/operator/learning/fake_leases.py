"""A stand-in for the API server's Leases: what leader election relies on, and only that.

A write that carries a resourceVersion other than the stored one is refused
(`ConflictError`, the API server's 409), a create of an existing name too, and
every write gives the object a new resourceVersion. Reads and writes copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.kube import ConflictError, NotFoundError, Resource
from dynamiccl.operator.learning.leader import LEASES


class FakeLeases:
    """Leases by (namespace, name), with optimistic concurrency on resourceVersion."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str | None, str], dict[str, Any]] = {}
        self.rv = 0
        self.writes = 0

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.writes += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        assert res == LEASES
        if (namespace, name) not in self.objs:
            raise NotFoundError(name)
        return copy.deepcopy(self.objs[(namespace, name)])

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.objs:
            raise ConflictError(key[1])
        self.objs[key] = copy.deepcopy(dict(body))
        return self._bump(self.objs[key])

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        obj = self.objs.get((namespace, name))
        if obj is None:
            raise NotFoundError(name)
        want = patch.get("metadata", {}).get("resourceVersion")
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise ConflictError(name)
        obj["spec"].update(patch.get("spec", {}))
        return self._bump(obj)

"""What the learning loop needs of the Kubernetes API (dicts in, dicts out).

The operator's adapter (operator/kube.py `Kube`) satisfies it; unit tests use
an in-memory table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dynamiccl.operator.kube import Patcher, Resource


class ClusterAPI(Patcher, Protocol):
    """The slice of the operator's Kubernetes adapter the loop uses."""

    def list(
        self, res: Resource, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]: ...

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]: ...

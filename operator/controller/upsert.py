"""Create an object, or bring an existing one to what the operator wants: the least write.

The operator owns the ConfigMap and the TuningRun it writes for a job. `upsert`
creates the object; when it exists, `upsert_patch` says what to change: its
labels, annotations and owner references, and the `data` / `spec` it carries, as
one JSON merge patch, or nothing when the object already says all of that (no
write, no new resourceVersion, no watch event). A merge patch keeps the keys it
does not name, so a `data` map is replaced whole: keys the operator dropped are
deleted (null), not left behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.kube import ConflictError, Kube, Resource


def upsert_patch(body: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that makes `current` carry `body`'s metadata and content (None: it
    already does)."""
    meta = body["metadata"]
    patch: dict[str, Any] = {
        "metadata": {
            "labels": meta.get("labels"),
            "annotations": meta.get("annotations"),
            "ownerReferences": meta.get("ownerReferences"),
        }
    }
    for key in ("data", "spec"):
        if key in body and current.get(key) != body[key]:
            patch[key] = body[key]
    old = current.get("metadata") or {}
    same_meta = all(old.get(k) == v for k, v in patch["metadata"].items() if v is not None)
    if len(patch) == 1 and same_meta:
        return None
    if "data" in patch:  # merge patch keeps removed keys: replace the whole map
        patch["data"] = {**dict.fromkeys(current.get("data") or {}), **body["data"]}
    return patch


def upsert(kube: Kube, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create `body`, or patch the existing object to it; returns the object as stored."""
    meta = body["metadata"]
    try:
        return kube.create(res, body)
    except ConflictError:
        pass
    current = kube.get(res, meta["name"], meta["namespace"])
    patch = upsert_patch(body, current)
    if patch is None:
        return current
    return kube.patch(res, meta["name"], patch, meta["namespace"])

"""Create an object, or bring an existing one to what the operator wants: the least write.

The operator owns the ConfigMap and the TuningRun it writes for a job. `upsert`
creates the object; when it exists, `upsert_patch` says what to change: its
labels, annotations and owner references, and the `data` / `binaryData` / `spec`
it carries, as one JSON merge patch, or nothing when the object already says all
of that (no write, no new resourceVersion, no watch event). A merge patch keeps
the keys it does not name, so a ConfigMap's `data` and `binaryData` maps are
replaced whole: keys the operator dropped are deleted (null), not left behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.kube import ConflictError, Kube, NotFoundError, Resource


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
    if "spec" in body and current.get("spec") != body["spec"]:
        patch["spec"] = body["spec"]
    if "data" in body:  # a ConfigMap: its data and binaryData (absent = empty, as stored)
        for key in ("data", "binaryData"):
            want, have = body.get(key) or {}, current.get(key) or {}
            if want != have:  # merge patch keeps removed keys: replace the whole map
                patch[key] = {**dict.fromkeys(have), **want}
    old = current.get("metadata") or {}
    same_meta = all(old.get(k) == v for k, v in patch["metadata"].items() if v is not None)
    if len(patch) == 1 and same_meta:
        return None
    return patch


def upsert(
    kube: Kube, res: Resource, body: Mapping[str, Any], current: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Create `body`, or patch the existing object to it; returns the object as stored.
    `current`: the object as the caller just read it from the apiserver (then no create
    attempt and no second GET; created after all when it is gone meanwhile)."""
    meta = body["metadata"]
    if current is None:
        try:
            return kube.create(res, body)
        except ConflictError:
            pass
        current = kube.get(res, meta["name"], meta["namespace"])
    patch = upsert_patch(body, current)
    if patch is None:
        return dict(current)
    try:
        return kube.patch(res, meta["name"], patch, meta["namespace"])
    except NotFoundError:
        return kube.create(res, body)

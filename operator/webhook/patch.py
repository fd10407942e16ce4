"""RFC 6902 JSON Patch between two documents (for the AdmissionReview response).

``diff(a, b)`` returns operations that turn ``a`` into ``b``: objects are diffed
key by key; a list that changed is handled element-wise when only appended or
prepended to (the common case for env, volumes, initContainers), otherwise
replaced whole. Written here rather than taken from the `jsonpatch` library:
its `make_patch` emits `move`/`copy` operations and whole-list rewrites that
are harder to read in an AdmissionReview; the tests and the demo apply our
patches with the library's `apply_patch`, which is the proof they are valid.

The operations' values are ``b``'s own objects, not copies (the webhook serializes the
patch at once; copying them was 2/3 of its CPU per pod): copy before changing ``b``.
"""

from __future__ import annotations

from typing import Any


def escape(token: str) -> str:
    """RFC 6901 escaping of one path token (``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(a: Any, b: Any, path: str = "") -> list[dict[str, Any]]:
    """Operations turning ``a`` into ``b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        ops: list[dict[str, Any]] = []
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in b.items():
            sub = f"{path}/{escape(key)}"
            if key not in a:
                ops.append({"op": "add", "path": sub, "value": value})
            else:
                ops += diff(a[key], value, sub)
        return ops
    if isinstance(a, list) and isinstance(b, list) and a != b:
        n = len(a)
        if len(b) > n and b[:n] == a:  # appended
            return [{"op": "add", "path": f"{path}/-", "value": v} for v in b[n:]]
        k = len(b) - n
        if k > 0 and b[k:] == a:  # prepended
            return [{"op": "add", "path": f"{path}/{i}", "value": b[i]} for i in range(k)]
        if len(a) == len(b):
            out: list[dict[str, Any]] = []
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                out += diff(x, y, f"{path}/{i}")
            return out
    if a == b and type(a) is type(b):
        return []
    return [{"op": "replace", "path": path, "value": b}]

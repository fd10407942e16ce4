"""RFC 6902 JSON Patch between two documents (for the AdmissionReview response).

``diff(a, b)`` returns operations that turn ``a`` into ``b``: objects are diffed
key by key; a list that changed is handled element-wise when only appended or
prepended to (the common case for env, volumes, initContainers), otherwise
replaced whole. ``apply`` is a small RFC 6902 applier (add/remove/replace) used
by the tests and ``dynamiccl inject`` to prove the patch reproduces the mutation.
"""

from __future__ import annotations

import copy
from typing import Any


def escape(token: str) -> str:
    """RFC 6901 escaping of one path token (``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


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
                ops.append({"op": "add", "path": sub, "value": copy.deepcopy(value)})
            else:
                ops += diff(a[key], value, sub)
        return ops
    if isinstance(a, list) and isinstance(b, list) and a != b:
        n = len(a)
        if len(b) > n and b[:n] == a:  # appended
            return [{"op": "add", "path": f"{path}/-", "value": copy.deepcopy(v)} for v in b[n:]]
        k = len(b) - n
        if k > 0 and b[k:] == a:  # prepended
            return [
                {"op": "add", "path": f"{path}/{i}", "value": copy.deepcopy(b[i])} for i in range(k)
            ]
        if len(a) == len(b):
            out: list[dict[str, Any]] = []
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                out += diff(x, y, f"{path}/{i}")
            return out
    if a == b and type(a) is type(b):
        return []
    return [{"op": "replace", "path": path, "value": copy.deepcopy(b)}]


def apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply add/remove/replace operations to a copy of ``doc``."""
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        if not tokens:
            if op["op"] == "remove":
                raise ValueError("cannot remove the whole document")
            out = copy.deepcopy(op["value"])
            continue
        parent = out
        for tok in tokens[:-1]:
            parent = parent[int(tok)] if isinstance(parent, list) else parent[tok]
        last = tokens[-1]
        if isinstance(parent, list):
            if op["op"] == "add":
                index = len(parent) if last == "-" else int(last)
                parent.insert(index, copy.deepcopy(op["value"]))
            elif op["op"] == "remove":
                del parent[int(last)]
            else:
                parent[int(last)] = copy.deepcopy(op["value"])
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in parent:
                raise ValueError(f"replace of missing {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
        else:
            del parent[last]
    return out

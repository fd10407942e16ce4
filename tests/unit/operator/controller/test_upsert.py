"""The least write that brings an object to what the operator wants (controller/upsert.py)."""

from __future__ import annotations

from typing import Any

from dynamiccl.operator.controller.upsert import upsert_patch

OWNER = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llm", "uid": "u1"}]


def _cm(data: dict[str, str], **meta: Any) -> dict[str, Any]:
    base = {"name": "dynamiccl-llm", "namespace": "ml", "labels": {"app": "dynamiccl"}}
    return {"metadata": base | {"ownerReferences": OWNER} | meta, "data": data}


def test_an_object_that_already_says_it_all_is_not_written() -> None:
    stored = _cm({"a": "1"}, resourceVersion="7", uid="x")  # the server's own fields differ
    assert upsert_patch(_cm({"a": "1"}), stored) is None


def test_a_dropped_data_key_is_deleted_not_left_behind() -> None:
    patch = upsert_patch(_cm({"b": "2"}), _cm({"a": "1", "b": "1"}))
    assert patch is not None
    assert patch["data"] == {"a": None, "b": "2"}  # null deletes "a" in a merge patch


def test_changed_labels_are_written_and_unchanged_content_is_not() -> None:
    patch = upsert_patch(_cm({"a": "1"}, labels={"app": "dynamiccl", "team": "x"}), _cm({"a": "1"}))
    assert patch is not None
    assert patch["metadata"]["labels"] == {"app": "dynamiccl", "team": "x"}
    assert "data" not in patch


def test_a_changed_spec_is_written() -> None:
    want = {"metadata": _cm({})["metadata"], "spec": {"policy": "b"}}
    have = {"metadata": _cm({})["metadata"], "spec": {"policy": "a"}}
    patch = upsert_patch(want, have)
    assert patch is not None
    assert patch["spec"] == {"policy": "b"}


def test_binary_data_is_written_replaced_and_removed_like_data() -> None:
    """The topology files' node map is binaryData: a new map is written, a dropped one deleted,
    and a ConfigMap stored without binaryData equals one that wants none (no write)."""
    new = _cm({"a": "1"}) | {"binaryData": {"map.gz": "QUJD"}}
    patch = upsert_patch(new, _cm({"a": "1"}))
    assert patch is not None
    assert patch["binaryData"] == {"map.gz": "QUJD"}
    assert "data" not in patch
    gone = upsert_patch(_cm({"a": "1"}), new)
    assert gone is not None
    assert gone["binaryData"] == {"map.gz": None}
    assert upsert_patch(_cm({"a": "1"}), _cm({"a": "1"}) | {"binaryData": {}}) is None
    assert upsert_patch(new, new | {"metadata": new["metadata"] | {"uid": "x"}}) is None


class _Calls:
    """The apiserver calls `upsert` makes (a stored object, or none)."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        self.stored, self.calls = stored, []  # type: ignore[var-annotated]

    def create(self, _res: Any, body: dict[str, Any]) -> dict[str, Any]:
        from dynamiccl.operator.kube import ConflictError  # noqa: PLC0415

        self.calls.append("create")
        if self.stored is not None:
            raise ConflictError("exists")
        self.stored = dict(body)
        return self.stored

    def get(self, _res: Any, _name: str, _ns: str) -> dict[str, Any]:
        self.calls.append("get")
        assert self.stored is not None
        return self.stored

    def patch(self, _res: Any, _name: str, patch: dict[str, Any], _ns: str) -> dict[str, Any]:
        from dynamiccl.operator.kube import NotFoundError  # noqa: PLC0415

        self.calls.append("patch")
        if self.stored is None:
            raise NotFoundError("gone")
        self.stored = {**self.stored, **{k: v for k, v in patch.items() if k != "metadata"}}
        return self.stored


def test_an_object_the_caller_just_read_is_patched_without_another_read() -> None:
    from dynamiccl.operator.controller.upsert import upsert  # noqa: PLC0415

    res: Any = None
    kube = _Calls(_cm({"a": "1"}))
    upsert(kube, res, _cm({"a": "2"}))  # type: ignore[arg-type]
    assert kube.calls == ["create", "get", "patch"]
    kube = _Calls(_cm({"a": "1"}))
    assert upsert(kube, res, _cm({"a": "2"}), _cm({"a": "1"}))["data"] == {"a": "2"}  # type: ignore[arg-type]
    assert kube.calls == ["patch"]
    kube = _Calls(_cm({"a": "1"}))
    upsert(kube, res, _cm({"a": "1"}), _cm({"a": "1"}))  # type: ignore[arg-type]
    assert kube.calls == []  # it already says it all
    kube = _Calls(None)  # gone since the caller read it: created again
    assert upsert(kube, res, _cm({"a": "2"}), _cm({"a": "1"}))["data"] == {"a": "2"}  # type: ignore[arg-type]
    assert kube.calls == ["patch", "create"]

"""benchmarks/inmemory_api.py: the stand-in apiserver out of the operator's process
(`RemoteAPI`) answers as the inline one does, errors included, and keeps its objects in
its own process (what the operator bench's memory figures rely on)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dynamiccl.operator.kube import CONFIGMAPS, ConflictError, NotFoundError
from tests.unit.benchmarks.bench_module import bench_module

api_mod = bench_module("inmemory_api")


@pytest.fixture
def remote() -> Iterator[Any]:
    api = api_mod.RemoteAPI()
    yield api
    api.close()


def _cm(name: str, data: str = "x") -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": {"a": "b"}},
        "data": {"k": data},
    }


def test_remote_answers_as_the_inline_stand_in_and_its_errors_cross(remote: Any) -> None:
    api = remote
    api_mod.counted(api)
    made = api.create(CONFIGMAPS, _cm("one"))
    assert made["metadata"]["uid"]
    assert made["data"] == {"k": "x"}
    api.patch(CONFIGMAPS, "one", {"data": {"k": "y"}}, "ns")
    assert api.get(CONFIGMAPS, "one", "ns")["data"] == {"k": "y"}
    assert [o["metadata"]["name"] for o in api.list(CONFIGMAPS, "ns", "a=b")] == ["one"]
    with pytest.raises(ConflictError):
        api.create(CONFIGMAPS, _cm("one"))
    api.delete(CONFIGMAPS, "one", "ns")
    with pytest.raises(NotFoundError):
        api.get(CONFIGMAPS, "one", "ns")
    with pytest.raises(NotFoundError):
        api.stored(CONFIGMAPS, "one", "ns")
    # every verb counted once per call; `stored` (the bench's own look) not at all
    assert api.calls == {"create": 2, "patch": 1, "get": 2, "list": 1, "delete": 1}


def test_what_the_remote_stand_in_stores_grows_its_process_not_this_one(remote: Any) -> None:
    api = remote
    before = api.rss_mib()
    for i in range(16):  # 16 x 4 MiB kept there: this process only sends them
        api.create(CONFIGMAPS, _cm(f"big-{i}", "z" * (4 << 20)))
    # 64 MiB kept; the bound leaves room for memory the process had freed before (fc18 saw
    # 28 MiB of growth for 32 MiB kept, under load)
    assert api.rss_mib() - before >= 40
    assert len(api.stored(CONFIGMAPS, "big-15", "ns")["data"]["k"]) == 4 << 20


def test_closing_ends_the_stand_ins_process() -> None:
    """The fork copies the parent's end of the pipe: unless the child closes it, the parent's
    close is no end of file there, the child outlives every test, and interpreter exit waits
    on it (two such children held a CI run until its time ran out)."""
    api = api_mod.RemoteAPI()
    proc = api._proc
    api._conn.close()
    proc.join(10)
    alive = proc.is_alive()
    if alive:
        proc.kill()
        proc.join()
    assert not alive

"""What both halves of benchmarks/operator_inmemory_bench.py share: the one stand-in.

The apiserver is `dynamiccl.testing.memory_api.MemoryAPI` (the objects in a table; the
handlers' deletes and Events as it takes them: a delete of nothing is no error, as
`Kube.delete`'s), with an index of label selectors (a pod list by job label costs what
the apiserver's watch cache costs, not a scan of every object here). `counted` wraps its
calls so that their number and time are counted apart from the operator's. `RemoteAPI`:
the same stand-in in a process of its own, so that what it stores (every job, pod and
full ConfigMap) is not in the operator's memory: in the operator's process it held the
freed ConfigMaps' pages (allocator fragmentation), 60-110 KiB per job, counted as the
operator's before.
`percentile`: the latencies' nearest-rank quantile both halves report.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dynamiccl.operator.kube import Resource
from dynamiccl.testing.memory_api import MemoryAPI

NS = "bench"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs")


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank, 0 < q <= 1); NaN when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


class CountingAPI(MemoryAPI):
    """MemoryAPI + a label index; counts calls and their time."""

    def __init__(self) -> None:
        self.by_label: dict[tuple[str, str | None, str, str], set[Any]] = {}
        self.calls: dict[str, int] = {}
        self.seconds = 0.0
        super().__init__()

    def add(self, res: Resource, obj: dict[str, Any]) -> None:
        super().add(res, obj)
        meta = obj["metadata"]
        for k, v in (meta.get("labels") or {}).items():
            key = (res.plural, meta.get("namespace"), meta["name"])
            self.by_label.setdefault((res.plural, meta.get("namespace"), k, v), set()).add(key)

    def list(self, res: Resource, namespace: str | None = None, label_selector: str = "") -> Any:
        terms = [kv.split("=", 1) for kv in label_selector.split(",") if kv]
        if not terms or namespace is None:
            return super().list(res, namespace, label_selector)
        keys = self.by_label.get((res.plural, namespace, *terms[0]), set())  # type: ignore[arg-type]
        objs = [self.objs[k] for k in sorted(keys) if k in self.objs]
        want = dict(terms)
        return [
            json.loads(json.dumps(o))
            for o in objs
            if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
        ]

    def stored(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The stored object, read without being counted (the bench's own look)."""
        return MemoryAPI.get(self, res, name, namespace)


def rss_mib() -> float:
    """VmRSS of this process in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _serve(conn: Connection, parent_end: Connection) -> None:
    """The stand-in's process: one call at a time from the pipe, its answer or exception back.
    The fork copied the parent's end of the pipe too: closed first, so that the parent's close
    is an end of file here (else this process outlives its caller, blocked in `recv`)."""
    parent_end.close()
    api = CountingAPI()
    while True:
        try:
            verb, args, kw = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, rss_mib() if verb == "rss" else getattr(api, verb)(*args, **kw)))
        except Exception as exc:  # handed to the caller, who raises it
            conn.send((False, exc))


class RemoteAPI:
    """CountingAPI in a forked process: the operator's process holds none of its objects,
    and the stand-in's own CPU runs there (the pickling of a call's objects, both ways in
    this process, is what `counted` takes off the operator's CPU; the real apiserver's
    client decodes JSON instead). Call `close` when done."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")  # before any thread of this process
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self._conn), daemon=True)
        self._proc.start()
        child.close()
        self.calls: dict[str, int] = {}
        self.seconds = 0.0

    def _call(self, verb: str, *args: Any, **kw: Any) -> Any:
        self._conn.send((verb, args, kw))
        ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def add(self, res: Resource, obj: dict[str, Any]) -> None:
        self._call("add", res, obj)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        return self._call("get", res, name, namespace)

    def list(self, res: Resource, namespace: str | None = None, label_selector: str = "") -> Any:
        return self._call("list", res, namespace, label_selector)

    def create(self, res: Resource, body: Mapping[str, Any]) -> Any:
        return self._call("create", res, body)

    def patch(self, res: Resource, name: str, patch: Mapping[str, Any], *a: Any, **kw: Any) -> Any:
        return self._call("patch", res, name, patch, *a, **kw)

    def delete(self, res: Resource, name: str, namespace: str | None = None) -> None:
        self._call("delete", res, name, namespace)

    def event(self, body: Mapping[str, Any]) -> None:
        self._call("event", body)

    def stored(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        """The stored object, read without being counted (the bench's own look)."""
        return self._call("stored", res, name, namespace)

    def rss_mib(self) -> float:
        """The stand-in process's VmRSS in MiB."""
        return float(self._call("rss"))

    def close(self) -> None:
        """End the stand-in's process: it leaves on end of file; killed if it does not."""
        self._conn.close()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


StandIn = CountingAPI | RemoteAPI


def counted(api: StandIn) -> None:
    """Wrap the stand-in's calls: count them and add their CPU time (the calling thread's)
    to ``api.seconds`` (wall time would count a loaded machine's waits, taken off the
    operator's CPU: a negative CPU per event at load 9)."""
    for verb in ("get", "list", "create", "patch", "delete", "event"):
        inner = getattr(api, verb)

        def call(*a: Any, _v: str = verb, _f: Callable[..., Any] = inner, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return _f(*a, **kw)
            finally:
                api.seconds += time.thread_time() - t0
                api.calls[_v] = api.calls.get(_v, 0) + 1

        setattr(api, verb, call)

"""Watch-fed in-memory caches (one daemon thread each), independent of kopf peering.

Both operator replicas serve the webhook, but only the kopf leader runs
handlers; the webhook therefore reads its own caches: the job ConfigMaps
(is this pod's job tuned, with which env knobs) — and the handlers read the
policies and nodes the same way instead of listing them per job.
Objects are reduced by a ``shrink`` function before being stored (memory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dynamiccl.constants import TOPO_FILE_NODES_KEY

Key = tuple[str, str]  # (namespace or "", name)


class Watcher(Protocol):
    """What a cache needs from the API adapter (``kube.Kube.watch``)."""

    def watch(
        self,
        res: Any,
        on_event: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
        label_selector: str = "",
    ) -> None: ...


def key_of(obj: Mapping[str, Any]) -> Key:
    """(namespace, name) of an object."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class ObjectCache:
    """A dict of (namespace, name) → shrunken object, kept current by a watch."""

    def __init__(self, shrink: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self._shrink = shrink or (lambda o: o)
        self._items: dict[Key, Any] = {}
        self._seen: set[Key] = set()
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self.changed = threading.Condition(self._lock)
        self.version = 0  # bumped by every event: "has anything in here changed since?"

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (also usable directly in tests)."""
        with self._lock:
            if kind == "RESYNCED":
                for stale in set(self._items) - self._seen:
                    del self._items[stale]
                self._seen = set()
                self.synced.set()
            elif kind == "DELETED":
                self._items.pop(key_of(obj), None)
            else:
                key = key_of(obj)
                self._items[key] = self._shrink(obj)
                if kind == "SYNC":
                    self._seen.add(key)
            self.version += 1
            self.changed.notify_all()

    def get(self, namespace: str, name: str) -> Any | None:
        """The cached object or None."""
        with self._lock:
            return self._items.get((namespace, name))

    def wait_for(self, namespace: str, name: str, timeout: float) -> Any | None:
        """Block up to ``timeout`` seconds for an object to appear."""
        with self._lock:
            self.changed.wait_for(lambda: (namespace, name) in self._items, timeout=timeout)
            return self._items.get((namespace, name))

    def values(self) -> list[Any]:
        """A snapshot of every cached object."""
        with self._lock:
            return list(self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def start(
        self, watcher: Watcher, res: Any, stop: threading.Event, label_selector: str = ""
    ) -> threading.Thread:
        """Run the watch in a daemon thread."""
        thread = threading.Thread(
            target=watcher.watch,
            args=(res, self.on_event, stop, label_selector),
            name=f"watch-{getattr(res, 'plural', res)}",
            daemon=True,
        )
        thread.start()
        return thread


def shrink_node(obj: dict[str, Any]) -> dict[str, Any]:
    """Keep only what ``nodes.node_facts`` reads from a Node."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return {
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {})},
        "status": {
            part: {k: v for k, v in (status.get(part) or {}).items() if k == "nvidia.com/gpu"}
            for part in ("capacity", "allocatable")
        },
    }


def shrink_node_topology(obj: dict[str, Any]) -> dict[str, Any]:
    """Keep only ``status.spec`` and ``status.ncclTopoFile`` of a NodeTopology."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    kept = {"spec": status.get("spec")}
    if status.get("ncclTopoFile") is not None:
        kept["ncclTopoFile"] = status["ncclTopoFile"]
    return {"metadata": {"name": meta.get("name")}, "status": kept}


def shrink_config_map(obj: dict[str, Any]) -> dict[str, Any]:
    """Keep what the webhook needs from a job ConfigMap (not the table/features)."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "data": {k: v for k, v in data.items() if k in ("env.json", "job.json")},
        # the topology files' node map: only its presence
        "binaryData": dict.fromkeys(
            [k for k in obj.get("binaryData") or {} if k == TOPO_FILE_NODES_KEY], ""
        ),
    }

"""Collecting what discovery could not establish, each with a name and a reason."""

from __future__ import annotations

from dynamiccl.api.node_topology import TopologyCondition


class Conditions:
    """An ordered, de-duplicated list of :class:`TopologyCondition`."""

    def __init__(self) -> None:
        self._items: list[TopologyCondition] = []
        self._seen: set[tuple[str, str, str]] = set()

    def add(self, field: str, reason: str, message: str) -> None:
        """Record that ``field`` is unknown (or degraded) because of ``reason``."""
        key = (field, reason, message)
        if key not in self._seen:
            self._seen.add(key)
            self._items.append(TopologyCondition(field=field, reason=reason, message=message))

    def unreadable(self, field: str, path: str, error: str | None) -> None:
        """A file discovery needed could not be read."""
        reason = "Missing" if error in (None, "missing") else "Unreadable"
        self.add(field, reason, f"{path}: {error or 'missing'}")

    def garbled(self, field: str, path: str, text: str) -> None:
        """A file was read but its content is not in the format the kernel prints."""
        shown = text.strip()
        if len(shown) > 40:
            shown = shown[:40] + "..."
        self.add(field, "Garbled", f"{path}: unexpected content {shown!r}")

    def items(self) -> list[TopologyCondition]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

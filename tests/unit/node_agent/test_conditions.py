"""Conditions are ordered, de-duplicated and say why."""

from __future__ import annotations

from dynamiccl.node_agent.conditions import Conditions


def test_dedup_and_reasons() -> None:
    c = Conditions()
    c.unreadable("x", "/sys/a", "missing")
    c.unreadable("x", "/sys/a", "missing")
    c.unreadable("y", "/sys/b", "Permission denied")
    c.garbled("z", "/sys/c", "0x" + "f" * 80)
    assert [(i.field, i.reason) for i in c.items()] == [
        ("x", "Missing"), ("y", "Unreadable"), ("z", "Garbled"),
    ]  # fmt: skip
    assert c.items()[2].message.endswith("...'")
    assert len(c) == 3

"""Test tiers: the folder a test lives in is its tier (unit / integration / e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))

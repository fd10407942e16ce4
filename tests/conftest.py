"""Test tiers: the folder a test lives in is its tier (unit / integration / e2e).

Test support is the package `dynamiccl.testing` (certificates, ports, PostgreSQL, builders,
the NCCL player; not shipped); hack/'s commands are loaded with `dynamiccl.testing.scripts`.
Hypothesis runs without its per-example deadline (see below).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# No per-example wall-clock deadline: the tests run beside builds and sanitizers
# on 2 cores, where a slow example is load, not a defect (speed is measured in
# benchmarks/). Examples and shrinking are unchanged.
settings.register_profile("dynamiccl", deadline=None)
settings.load_profile("dynamiccl")

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))

"""Test tiers: the folder a test lives in is its tier (unit / integration / e2e).

hack/ goes on sys.path, so tests import its helper scripts by name
(`import selfsigned_cert`, `import pg_server`, `import gen_nodes`) instead of
each loading them by path (pytest runs with --import-mode=importlib).
Hypothesis runs without its per-example deadline (see below).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example wall-clock deadline: the tests run beside builds and sanitizers
# on 2 cores, where a slow example is load, not a defect (speed is measured in
# benchmarks/). Examples and shrinking are unchanged.
settings.register_profile("dynamiccl", deadline=None)
settings.load_profile("dynamiccl")

_HACK = str(Path(__file__).resolve().parents[1] / "hack")
if _HACK not in sys.path:
    sys.path.insert(0, _HACK)

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))

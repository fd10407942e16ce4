"""Test tiers: the folder a test lives in is its tier (unit / integration / e2e).

Test support is the package `dynamiccl.testing` (certificates, ports, PostgreSQL, builders,
the NCCL player; not shipped); hack/'s commands are loaded with `dynamiccl.testing.scripts`.
Hypothesis runs without its per-example deadline (see below).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import sys
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


# How long a finished session may take to exit before every thread's stack is dumped and the
# process exits non-zero: a hang at exit becomes a visible failure, not a silent CI timeout.
EXIT_WATCHDOG_S = 120


def pytest_unconfigure(config: pytest.Config) -> None:
    """Nothing a test left behind may hold the run at exit: multiprocessing joins its live
    children at interpreter exit without a timeout (a CI run hung there), so they are killed
    here and named; and a watchdog dumps the stacks if exit still takes too long."""
    for child in multiprocessing.active_children():
        sys.stderr.write(f"conftest: killing leftover child process {child.name} ({child.pid})\n")
        child.kill()
        child.join(5)
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)

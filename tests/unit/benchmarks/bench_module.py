"""A script of benchmarks/ imported as a module, for its tests (benchmarks/ is no package)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def bench_module(name: str) -> ModuleType:
    """`benchmarks/<name>.py`, its sibling scripts importable by name while it loads."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))

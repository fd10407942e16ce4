"""Shared helpers for node agent tests: the committed host fixtures and copies to mutate."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

LAYOUTS = (
    "dgx-h100",
    "dgx-a100",
    "aws-p5",
    "roce-h200",
    "pcie-l40s",
    "gb200-nvl72-tray",
    "container-2of8",
)


@pytest.fixture
def fixture_root() -> Callable[[str], Path]:
    """Path of a committed (read-only by convention) host fixture."""

    def get(name: str) -> Path:
        root = FIXTURES / name
        assert root.is_dir(), f"missing fixture {root}"
        return root

    return get


@pytest.fixture
def host_copy(tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of a host fixture that a test may break."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return copy

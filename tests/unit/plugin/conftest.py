"""Fixtures for the plugin tests: a fresh copy of the real .so per test (fresh process globals)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamiccl.sidecar import shm
from dynamiccl.testing.nccl_player import Plugin, default_so

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def so_path() -> Path:
    path = default_so()
    if not path.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT / "plugin")], check=True)
    return path


@pytest.fixture
def fresh_so(so_path: Path, tmp_path: Path) -> Path:
    """A private copy: dlopen of a new path gives the plugin fresh process-level state."""
    dst = tmp_path / "libnccl-tuner-dynamiccl-copy.so"
    shutil.copy(so_path, dst)
    return dst


@pytest.fixture
def no_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNAMICCL_SHM_PATH", raising=False)
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)


@pytest.fixture
def shm_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[shm.ShmFile]:
    """A valid shared-memory file with L=64, named by DYNAMICCL_SHM_PATH."""
    path = tmp_path / "dynamiccl.shm"
    shm.create(path, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    f = shm.ShmFile(path)
    yield f
    f.close()


@pytest.fixture
def plugin(fresh_so: Path) -> Plugin:
    return Plugin(fresh_so)

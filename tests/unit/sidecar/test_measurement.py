"""The sidecar sees, from the real plugin's process slots, a process NCCL tunes but never measures.

The .so is loaded through dlopen and called in NCCL's order by the harness (a stand-in for NCCL):
NCCL < 2.27 inits only the tuner; NCCL >= 2.27 inits the profiler of a communicator first.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamiccl.sidecar import shm
from dynamiccl.sidecar.measurement import MeasurementWatch, unmeasured
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so


@pytest.fixture
def shm_and_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[shm.ShmFile, Plugin]]:
    if not default_so().exists():
        pytest.fail("the plugin is not built (make plugin)")
    path = tmp_path / "dynamiccl.shm"
    shm.create(path, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "libnccl-tuner-dynamiccl-copy.so"  # a fresh copy: fresh process globals
    shutil.copy(default_so(), so)
    f = shm.ShmFile(path)
    yield f, Plugin(so)
    f.close()


def _gauge(metrics: AgentMetrics) -> float:
    value = metrics.registry.get_sample_value("dynamiccl_sidecar_unmeasured_processes")
    assert value is not None
    return value


def test_tuner_without_profiler_is_reported_once(
    shm_and_plugin: tuple[shm.ShmFile, Plugin], caplog: pytest.LogCaptureFixture
) -> None:
    f, plugin = shm_and_plugin
    comm = Comm(plugin, 3, 8, 1)  # tuner ABI v3: NCCL 2.22-2.26, no profiler ABI it loads
    metrics = AgentMetrics()
    watch = MeasurementWatch(metrics)
    (slot,) = f.procs()
    assert (slot.tuner_abi, slot.profiler_abi) == (3, 0)
    with caplog.at_level(logging.WARNING, logger="dynamiccl.sidecar"):
        assert watch.check(f.procs()) == 1
        assert watch.check(f.procs()) == 1
    assert _gauge(metrics) == 1
    warnings = [r.getMessage() for r in caplog.records if "tuned, not measured" in r.getMessage()]
    assert len(warnings) == 1
    comm.finalize()


def test_profiler_and_tuner_is_measured(shm_and_plugin: tuple[shm.ShmFile, Plugin]) -> None:
    f, plugin = shm_and_plugin
    prof = ProfiledComm(plugin, 5, 8, 1, comm_id=2)
    comm = Comm(plugin, 5, 8, 1, comm_id=2)
    metrics = AgentMetrics()
    assert unmeasured(f.procs()) == []
    assert MeasurementWatch(metrics).check(f.procs()) == 0
    assert _gauge(metrics) == 0
    comm.finalize()
    prof.finalize()

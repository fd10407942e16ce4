"""The real .so at start-up: only the plugin structs exported, and every way a process can
find no usable shared-memory file (unset, not there yet, unopenable, corrupt) leaves NCCL's own
choice in place with one log line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamiccl.sidecar import shm
from dynamiccl.testing.nccl_player import (
    PROFILER_VERSIONS,
    TUNER_VERSIONS,
    Comm,
    Plugin,
    realistic_cost_table,
    tuning_logs,
)

EXPECTED_EXPORTS = sorted(
    [f"ncclTunerPlugin_v{v}" for v in TUNER_VERSIONS]
    + [f"ncclProfiler_v{v}" for v in PROFILER_VERSIONS]
)


def test_only_the_plugin_structs_are_exported(so_path: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(so_path)], capture_output=True, text=True, check=True
    ).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    # an ASan build adds one ODR indicator per exported global; nothing else may appear
    names = [n for n in names if not n.startswith("__odr_asan.")]
    assert names == EXPECTED_EXPORTS


@pytest.mark.parametrize("version", TUNER_VERSIONS)
def test_no_shm_is_passthrough_with_one_log_line(
    plugin: Plugin, no_shm: None, version: int
) -> None:
    comm = Comm(plugin, version, nranks=16, nnodes=2, comm_id=5)
    for i in range(3 * 4096 + 5):
        cost = realistic_cost_table(4, 1 << (i % 30), 16, 2, nvls=True)
        info = comm.get_coll_info(4, 1 << (i % 30), cost)
        assert info.cost == [[pytest.approx(v) for v in row] for row in cost]
        assert info.nchannels == 0
    comm.finalize()
    logs = tuning_logs(plugin)
    assert len(logs) == 1
    assert "DYNAMICCL_SHM_PATH not set" in logs[0]


NCCL_LOG_WARN = 2  # ncclDebugLogLevel
NCCL_LOG_INFO = 3


def test_a_file_that_exists_but_cannot_be_opened_is_a_warning(
    fresh_so: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing file is normal at start (INFO, retried); one that exists but can't be opened
    (here a directory: EISDIR; in a pod, EACCES for another uid) leaves the process untuned, and
    says so at WARN, which NCCL prints by default."""
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(tmp_path / "absent.shm"))
    missing = Plugin(fresh_so)
    Comm(missing, 6, 8, 1).get_coll_info(4, 4096, realistic_cost_table(4, 4096, 8, 1))
    assert [lvl for lvl, m in missing.logs if "shared memory" in m] == [NCCL_LOG_INFO]

    (tmp_path / "dir.shm").mkdir()
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(tmp_path / "dir.shm"))
    copy = tmp_path / "copy-eisdir.so"
    copy.write_bytes(fresh_so.read_bytes())
    denied = Plugin(copy)
    cost = realistic_cost_table(4, 4096, 8, 1)
    got = Comm(denied, 6, 8, 1).get_coll_info(4, 4096, cost).cost
    assert got == [[pytest.approx(v) for v in r] for r in cost]  # NCCL's own choice
    lines = [(lvl, m) for lvl, m in denied.logs if "shared memory" in m]
    assert len(lines) == 1
    assert lines[0][0] == NCCL_LOG_WARN
    assert "runs untuned" in lines[0][1]
    assert "as uid" in lines[0][1]


def test_missing_file_and_corrupt_header_are_passthrough(
    fresh_so: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(tmp_path / "absent.shm"))
    p = Plugin(fresh_so)
    comm = Comm(p, 6, 8, 1)
    cost = realistic_cost_table(4, 4096, 8, 1)
    assert comm.get_coll_info(4, 4096, cost).cost == [[pytest.approx(v) for v in r] for r in cost]
    assert len(tuning_logs(p)) == 1
    assert "not there yet" in tuning_logs(p)[0]

    bad = tmp_path / "bad.shm"
    shm.create(bad, 64)
    with bad.open("r+b") as f:
        f.seek(30)
        f.write(b"\xff")  # header CRC no longer matches
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(bad))
    copy = tmp_path / "copy2.so"
    copy.write_bytes(fresh_so.read_bytes())
    p2 = Plugin(copy)
    comm2 = Comm(p2, 5, 8, 1)
    assert comm2.get_coll_info(4, 4096, cost).nchannels == 0
    assert len(tuning_logs(p2)) == 1
    assert "corrupt header" in tuning_logs(p2)[0]

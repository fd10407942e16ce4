"""`make gpu-test` (hack/gpu_test.py) without a GPU: the skip line, NCCL's TUNING lines, the
surface CSV, and the forcing table it writes, played against the real .so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.policy.sim.surface import parse_surface
from dynamiccl.testing import scripts
from dynamiccl.testing.nccl_player import Comm, Plugin, realistic_cost_table

gpu_test = scripts.load("gpu_test")

ROOT = Path(__file__).resolve().parents[3]

# NCCL 2.30's rank-0 TUNING line (src/enqueue.cc), between other INFO lines
LOG = """\
host:1:1 [0] NCCL INFO TUNER/Plugin: Using dynamiccl (v6)
host:1:1 [0] NCCL INFO PROFILER/Plugin: Loaded dynamiccl (v6)
host:1:1 [0] NCCL INFO DynamICCL: using /tmp/x/dynamiccl.shm (epoch interval 64)
host:1:1 [0] NCCL INFO AllReduce: 4 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
host:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
host:1:1 [0] NCCL INFO AllGather: 2048 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}
host:1:1 [0] NCCL INFO ReduceScatter: 2048 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..3}
host:1:1 [0] NCCL INFO ReduceScatter: 2048 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..3}
"""


def test_no_gpu_skips_with_one_line() -> None:
    # no GPU whatever the machine; and no sanitizer preload (make -C plugin asan) for torch
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {"CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gpu_test.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gpu-test: skipped, no CUDA GPU on this machine (")


def test_tuning_lines_and_loaded_plugin() -> None:
    ran = gpu_test.parse_tuning(LOG.splitlines())
    assert ran[("AllReduce", 4096)] == {("ring", "ll")}
    assert ran[("ReduceScatter", 2048)] == {("nvls", "simple"), ("ring", "ll")}
    assert gpu_test.parse_tuning(
        ["h:1:1 [0] NCCL INFO AllReduce: 8 Bytes -> Algo NVLSTree proto Simple"]
    ) == {("AllReduce", 8): {("nvls_tree", "simple")}}
    assert gpu_test._check_loaded(Path("/tmp/x"), LOG) == ""
    no_prof = LOG.replace("PROFILER/Plugin: Loaded", "PROFILER/Plugin: Could not load")
    assert "as profiler" in gpu_test._check_loaded(Path("/tmp/x"), no_prof)
    nccl_2_27 = LOG.replace("Using dynamiccl (v6)", "Using tuner plugin dynamiccl").replace(
        "Loaded dynamiccl (v6)", "loaded dynamiccl"
    )
    assert gpu_test._check_loaded(Path("/tmp/x"), nccl_2_27) == ""


def _point(coll: str, nbytes: int, count_bytes: int, times: list[float]) -> dict[str, Any]:
    return {"collective": coll, "nbytes": nbytes, "count_bytes": count_bytes, "times_us": times}


def test_surface_rows_only_where_nccl_confirms(tmp_path: Path) -> None:
    cfg = gpu_test.Config("ring", "ll", ("allreduce", "allgather", "reducescatter"))
    rank0 = [
        _point("allreduce", 4096, 4096, [10.0, 12.0, 11.0]),
        _point("allgather", 4096, 2048, [20.0, 20.0, 20.0]),
        _point("reducescatter", 4096, 2048, [30.0, 30.0, 30.0]),
        _point("allreduce", 1 << 20, 1 << 20, [99.0, 99.0, 99.0]),
    ]
    rank1 = [dict(p, times_us=[t + d for t, d in zip(p["times_us"], (3.0, -5.0, 0.0), strict=True)])
             for p in rank0]  # fmt: skip
    pts = gpu_test.surface_rows(cfg, [rank0, rank1], gpu_test.parse_tuning(LOG.splitlines()))
    assert pts.ruled_out == ["allreduce 1048576 B: NCCL ran nothing it logged"]
    assert pts.mixed == ["reducescatter 4096 B: NCCL ran nvls/simple, ring/ll"]
    # per iteration the slowest rank: 13, 12, 11 -> mean 12, stdev 1
    assert pts.rows[0] == ("allreduce", "4096", "ring", "ll", "", "12.000", "1.000")
    assert pts.rows[1][:2] == ("allgather", "4096")
    path = tmp_path / "surface.csv"
    gpu_test.write_surface(path, pts.rows)
    surface = parse_surface(path.read_text(), source=str(path))  # the product's surface reader
    assert len(surface.rows) == 2
    assert path.read_text().splitlines()[0] == ",".join(gpu_test.HEADER)


def test_forcing_table_through_the_real_plugin(
    tmp_path: Path, fresh_so: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file gpu_test writes makes the plugin force the pair from call L on, nothing before."""
    path = tmp_path / "dynamiccl.shm"
    cfg = gpu_test.Config("ring", "ll", ("allreduce", "allgather"))
    gpu_test._table_file(cfg, 8, path)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    comm = Comm(Plugin(fresh_so), 6, 8, 1, comm_id=1)
    forced = []
    for i in range(2 * gpu_test.INTERVAL):
        n = 1 << (12 + i % 16)
        info = comm.get_coll_info(2, n, realistic_cost_table(2, n, 8, 1, nvls=True))
        forced.append((info.algo, info.proto) == (1, 0) and info.cost[1][0] == 0.0)
    assert not any(forced[: gpu_test.INTERVAL])
    assert all(forced[gpu_test.INTERVAL :])
    rs = comm.get_coll_info(3, 4096, realistic_cost_table(3, 4096, 8, 1))  # not in cfg: untouched
    assert rs.cost == [
        [pytest.approx(v) for v in row] for row in realistic_cost_table(3, 4096, 8, 1)
    ]
    comm.finalize()
    assert gpu_test.slot_report(path) == (6, 0, 0)  # tuner v6 loaded, no profiler, no record


def test_whole_run_with_a_stand_in_for_nccl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() end to end on 2 pretend GPUs: workers that play NCCL against the real glibc-2.17 .so
    (fake_gpu_worker.py), the INFO checks, the slots' ABI bytes and records, the surface CSV."""
    monkeypatch.setattr(gpu_test, "gpu_count", lambda: (2, ""))
    monkeypatch.setattr(gpu_test, "WORKER", Path(__file__).with_name("fake_gpu_worker.py"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "gpu"
    assert gpu_test.main(["--out", str(out), "--iters", "3", "--sizes", "4096,1048576"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"gpu-test: 30 rows on 2 GPUs -> {out / 'surface.csv'}", lines
    assert "gpu-test: nvls-simple: tuner ABI v6, profiler ABI v6, " in "\n".join(lines)
    surface = parse_surface((out / "surface.csv").read_text())
    pairs = {(r.algo.value, r.proto.value) for r in surface.rows}
    assert pairs == {(c.algo, c.proto) for c in gpu_test.configs()}

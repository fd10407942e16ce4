"""A rank process plays NCCL against the real plugin: NCCL's pick, then the agreed table's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl import constants as c
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.testing.nccl_player import default_so
from dynamiccl.testing.rank import RankArgs, RankReport, init_barrier
from dynamiccl.testing.workload import TimeTable, cfg_key

ROOT = Path(__file__).resolve().parents[3]
N = 4096
IGN = -1.0


def _times() -> TimeTable:
    cost = [[IGN] * 3 for _ in range(7)]
    cost[0][0], cost[1][0], cost[1][1] = 10.0, 12.0, 20.0  # NCCL picks tree/LL
    return TimeTable(
        topology="t",
        nranks=2,
        nnodes=1,
        cost={f"4:{N}": cost},
        nccl_channels={f"4:{N}:0:0": 2, f"4:{N}:1:0": 2, f"4:{N}:1:1": 4},
        nccl_default_us={f"4:{N}": 100.0},
        nccl_default={f"4:{N}": (0, 0, 2)},
        mean_us={
            cfg_key(4, N, 0, 0, 0, 0): 100.0,
            cfg_key(4, N, 1, 0, 0, 0): 80.0,
            cfg_key(4, N, 1, 1, 0, 0): 50.0,
        },
    )


def _run(tmp_path: Path, shm_path: Path | None, steps: int = 200) -> tuple[RankReport, str]:
    so = default_so()
    if not so.exists():
        pytest.skip("plugin not built (make plugin)")
    (tmp_path / "t.json").write_text(_times().model_dump_json())
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    (barrier / "1").touch()  # the other rank of the communicator already initialised
    args = RankArgs(
        rank=0,
        nranks=2,
        nnodes=1,
        comm_id=77,
        steps=steps,
        ops=[(4, N, 1)],
        time_table=str(tmp_path / "t.json"),
        seed=3,
        out=str(tmp_path / "out.json"),
        progress=str(tmp_path / "progress"),
        stop=str(tmp_path / "STOP"),
        barrier=str(barrier),
    )
    (tmp_path / "args.json").write_text(args.model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    env["PYTHONPATH"] = str(ROOT)
    env[c.ENV_NCCL_TUNER_PLUGIN] = str(so)
    if shm_path is not None:
        env[c.ENV_SHM_PATH] = str(shm_path)
    done = subprocess.run(
        [sys.executable, "-m", "dynamiccl.testing.rank", str(tmp_path / "args.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return RankReport.model_validate_json((tmp_path / "out.json").read_text()), done.stderr


def test_without_shared_memory_nccl_decides(tmp_path: Path) -> None:
    rep, _ = _run(tmp_path, None)
    assert rep.calls == 200
    assert not rep.mapped
    assert rep.decisions == {f"4:{N}": {"0:0:0:0": 200}}
    assert rep.time_us[f"4:{N}"] == pytest.approx(200 * 100.0, rel=0.01)
    assert (tmp_path / "progress").read_text() == "200"


def test_the_committed_table_takes_effect_at_its_boundary(tmp_path: Path) -> None:
    path = tmp_path / "job.shm"
    shm.create(path, 64)
    table = DecisionTable(
        version=1,
        scales=(scale_class(2, 1),),
        cells=(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=12,
                scale=scale_class(2, 1),
                choices=(Choice(algo=Algo.RING, proto=Proto.LL128),),
            ),
        ),
    )
    with shm.ShmFile(path) as f:
        f.write_table(1, shm_table.encode_table(table, 1))
        f.set_entry(1, shm.EPOCH_COMMITTED, 64)
    rep, _ = _run(tmp_path, path)
    assert rep.mapped
    assert rep.decisions == {f"4:{N}": {"0:0:0:0": 64, "1:1:0:0": 136}}
    assert rep.time_us[f"4:{N}"] == pytest.approx(64 * 100.0 + 136 * 50.0, rel=0.01)
    with shm.ShmFile(path) as f:
        (slot,) = f.procs()
        recs = f.drain(slot.index)
    assert len(recs) == 200  # one profiler record per collective, for the sidecar
    assert [(r.algo, r.proto) for r in recs[62:66]] == [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert recs[100].exec_ns == pytest.approx(50_000, rel=0.15)


def test_the_init_barrier_waits_for_every_rank(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not every rank"):
        init_barrier(tmp_path / "b", 0, 2, timeout_s=0.1)
    (tmp_path / "b" / "1").touch()
    init_barrier(tmp_path / "b", 0, 2, timeout_s=0.1)

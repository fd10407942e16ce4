"""A call's tag (NCCL profiler v7 userTag) is a label of its reward records.

Played through the real plugin (profiler and tuner v7, in NCCL's order) into the shared
memory file, drained by the real sidecar: a job's two phases, tagged by the application,
come out as separate records, each with its tag and its own calls and times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.sidecar.runner import Options, Runner
from dynamiccl.testing.nccl_player import (
    Comm,
    Plugin,
    ProfiledComm,
    default_so,
    realistic_cost_table,
)
from tests.unit.sidecar.conftest import ConfigDir
from tests.unit.sidecar.test_runner import Ingest, agent_config, ingest

__all__ = ["ingest"]  # test_runner's fixture: an ingest on a temporary store

FORWARD, BACKWARD = 0x1, 0xB0000000000000A  # two phases' tags (any uint64)


def test_each_tag_is_a_label_of_its_own_records(
    config_dir: ConfigDir, tmp_path: Path, ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = agent_config(config_dir, tmp_path, ingest).model_copy(update={"ingest_url": ""})
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(cfg.shm_path))
    so = tmp_path / "rank.so"
    so.write_bytes(default_so().read_bytes())
    plugin = Plugin(so)
    prof = ProfiledComm(plugin, 7, 8, 2, comm_id=0x7A6)
    comm = Comm(plugin, 7, 8, 2, comm_id=0x7A6)
    r = Runner(cfg, backends=None, options=Options(flush_s=0.0))
    played = {FORWARD: (30, 4.0), BACKWARD: (20, 11.0), 0: (10, 7.0)}  # tag: (calls, us)
    for tag, (n, us) in played.items():
        for _ in range(n):
            info = comm.get_coll_info(4, 1 << 17, realistic_cost_table(4, 1 << 17, 8, 2))
            prof.collective(4, 1 << 15, b"ncclFloat32", info.algo, info.proto, 4, us, user_tag=tag)
    r.once()
    (seq,) = r.spool.outbox()
    batch = RewardBatch.model_validate_json(r.spool.read_batch(seq) or b"")
    by_tag: dict[int, tuple[int, float]] = {}
    for rec in batch.records:
        calls, total = by_tag.get(rec.user_tag, (0, 0.0))
        by_tag[rec.user_tag] = (calls + rec.count, total + rec.count * rec.mean_time_us)
    assert {t: (n, round(s / n, 6)) for t, (n, s) in by_tag.items()} == {
        t: (n, us) for t, (n, us) in played.items()
    }
    comm.finalize()
    prof.finalize()
    r.close()

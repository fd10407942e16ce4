"""Mode `static`: the guardrail takes a bad table back, through the real plugin.

The sidecar (`Runner`: ring drain, attribution, `StaticTuning`, the epoch protocol
with file CAS stores) runs against this test process playing one rank through a
private copy of the plugin `.so` (dynamiccl/testing/nccl_player.py), as
tests/unit/sidecar/test_runner.py
does. The one stand-in: execution times come from a formula (`_time`), in which the
static table's choice (tree / LL) takes 1.5x the time of NCCL's own pick (ring / simple,
the lowest entry of the cost table NCCL hands the plugin).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, ExploreSchedule, scale_class
from dynamiccl.policy.runtime.comparison import compare_half_life, with_comparison
from dynamiccl.sidecar.cas import FileCAS
from dynamiccl.sidecar.config import AgentConfig, load
from dynamiccl.sidecar.proposer import DirTableStore
from dynamiccl.sidecar.runner import Options, Runner
from dynamiccl.sidecar.static_guard import StaticTuning
from dynamiccl.sidecar.table_changes import Backends, Settings
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so, play
from tests.unit.sidecar.conftest import ConfigDir, exploration, features

L = 256
MIN_SAMPLES = 20
BUCKETS = (16, 20, 24)
RING, TREE, SIMPLE, LL = 1, 0, 2, 0  # NCCL ids
SLOWER = 1.5


def _cost(_coll: int, _nbytes: int) -> list[list[float]]:
    t = [[-1.0] * 3 for _ in range(7)]
    t[TREE] = [9.0, 8.0, 7.0]
    t[RING] = [6.0, 5.0, 4.0]  # NCCL picks ring / simple
    return t


def _time(_coll: int, nbytes: int, algo: int, proto: int, _nch: int) -> float:
    base = 5.0 + nbytes / 4e4
    return base * (SLOWER if (algo, proto) == (TREE, LL) else 1.0)


def static_table(
    version: int = 1,
    buckets: tuple[int, ...] = BUCKETS,
    choice: tuple[Algo, Proto] = (Algo.TREE, Proto.LL),
) -> DecisionTable:
    """A static table forcing `choice` (tree / LL: 1.5x slower than NCCL's pick) on all-reduce,
    with the compile's comparison arm."""
    sc = scale_class(8, 2)
    cells = tuple(
        with_comparison(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=b,
                scale=sc,
                choices=(Choice(algo=choice[0], proto=choice[1]),),
            ),
            (Algo.RING, Proto.SIMPLE),
        )
        for b in buckets
    )
    half_life = compare_half_life(MIN_SAMPLES)
    return DecisionTable(
        version=version,
        scales=(sc,),
        cells=cells,
        explore=ExploreSchedule(seed=3, half_life_log2=half_life),
    )


def static_config(
    config_dir: ConfigDir, tmp_path: Path, table: DecisionTable | None = None
) -> AgentConfig:
    """A static job's sidecar configuration (`table`: `static_table()`)."""
    ex = exploration("static")
    ex["guardrails"] = {"regressionThreshold": 0.05, "minSamples": MIN_SAMPLES}
    d = config_dir(
        features_json=features(replicas=1, nproc=1).model_dump(mode="json"),
        table_json=(table or static_table()).model_dump(mode="json"),
        exploration_json=ex,
    )
    env = {
        "DYNAMICCL_POD_NAME": "llm-worker-0",
        "DYNAMICCL_POD_UID": "pod-uid-0",
        "DYNAMICCL_SHM_PATH": str(tmp_path / "shm" / "dynamiccl.shm"),
        "DYNAMICCL_EPOCH_INTERVAL": str(L),
    }
    return load(d, env)


def sidecar(cfg: AgentConfig, tmp_path: Path, min_lead: int = 8) -> Runner:
    """The sidecar with file CAS stores and a stand-in clock (50 ms a reading); a fixed lead:
    this single thread plays a round of calls and must never reach a boundary whose votes
    are still open (the plugin would wait)."""
    coord = tmp_path / "coord"
    backends = Backends(
        FileCAS(coord / "r.json"), FileCAS(coord / "l.json"), DirTableStore(coord / "t")
    )
    ticks = itertools.count(0.0, 0.05)
    settings = Settings(min_lead=min_lead, min_interval_s=0.0, lead_time_s=0.0)
    return Runner(
        cfg,
        backends=backends,
        options=Options(flush_s=0.0, coordination=settings),
        clock=lambda: next(ticks),
    )


def test_a_static_table_slower_than_nccl_is_reverted_within_min_samples_comparisons(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = static_config(config_dir, tmp_path)
    runner = sidecar(cfg, tmp_path)
    assert isinstance(runner.tuning, StaticTuning)
    assert runner.coordination is not None
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(cfg.shm_path))
    so = tmp_path / "rank.so"
    so.write_bytes(default_so().read_bytes())
    plugin = Plugin(so)
    comm = Comm(plugin, 5, 8, 2, comm_id=0x5EED)
    prof = ProfiledComm(plugin, 5, 8, 2, comm_id=0x5EED)
    played = []
    judged: list[int] = []  # per cell: the table choice's calls measured when the guard tripped
    for r in range(40):
        calls = [(4, 1 << BUCKETS[(r * L + i) % 3]) for i in range(L)]
        played += play(comm, calls, _time, profiler=prof, cost_fn=_cost)
        runner.drain_once()
        runner.coordination.step()
        runner.coordination.step()
        if not judged and runner.tuning.reverted():
            judged = [c.stats[0].n for c in runner.tuning.guarded.values()]
    runner.close()
    # every cell was judged at the first round's end with minSamples of both sides: with
    # its choice's minSamples calls, plus at most the calls of the round that brought them
    assert len(runner.tuning.reverted()) == len(BUCKETS)
    assert judged
    assert all(MIN_SAMPLES <= n < MIN_SAMPLES + L // len(BUCKETS) for n in judged), judged
    # the table's choice ran (its table was in effect), then the revert reached the plugin:
    # from one boundary on, every call runs NCCL's own pick
    bad = [i for i, p in enumerate(played) if (p.algo, p.proto) == (TREE, LL)]
    assert bad
    assert all((p.algo, p.proto) == (RING, SIMPLE) for p in played[bad[-1] + 1 :])
    assert (bad[-1] + 1) % L == 0
    assert bad[-1] + 1 < len(played) - 4 * L
    events = [e for e in runner.tuning.take_events() if e.kind.value == "guardrail_revert"]
    assert len(events) == len(BUCKETS)

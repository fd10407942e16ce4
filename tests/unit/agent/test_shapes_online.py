"""A communicator shape no table covers is measured, tuned online and agreed on by every rank.

Real pieces: the plugin `.so` (one private copy per rank, driven through ctypes in
NCCL's call order: tuner init, getCollInfo per collective, profiler Coll and KernelCh
events), the shared-memory files, two complete sidecars (`Runner`) with their epoch
protocol over file CAS backends. Stand-in: the response surface. NCCL's cost table for
the communicator is the policy package's model of NCCL (what real NCCL would pass the
tuner, so NCCL picks what that model picks); the measured time of a configuration is
that model's estimate with 3 % jitter, except NCCL's own pick, which runs
`NCCL_SLOWER` times slower than NCCL estimates (reality departing from NCCL's model).
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from dynamiccl.agent.cas import FileCAS
from dynamiccl.agent.config import load
from dynamiccl.agent.coordination import Backends, Settings
from dynamiccl.agent.coordinator import DirTableStore
from dynamiccl.agent.harness import Comm, Played, Plugin, ProfiledComm, default_so, play
from dynamiccl.agent.runner import Options, Runner
from dynamiccl.agent.shapes import ShapeDefaults
from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import DecisionTable, scale_class
from tests.unit.agent.conftest import ConfigDir, features, learned_table

L = 256
NRANKS, NNODES = 2, 2  # one rank on each of the job's 2 nodes: a data-parallel group
COMM_IDS = (0xD0D0, 0xC0C0)  # NCCL's commIds: each the same on every rank of its communicator
SIZES = (1 << 20, 1 << 24)  # all-reduce calls of two size buckets, alternating
NCCL_SLOWER = 1.6
MAX_ROUNDS = 120


class Surface:
    """NCCL's cost table from the model of NCCL; measured times where NCCL's pick is slower."""

    def __init__(self) -> None:
        model = ShapeDefaults(features()).model(NRANKS, NNODES)
        assert model is not None
        self.model = model

    def cost(self, coll: int, nbytes: int) -> list[list[float]]:
        t = self.model.times([coll], [nbytes])[0]
        return [[float(v) if math.isfinite(v) else -1.0 for v in row] for row in t]

    def pick(self, coll: int, nbytes: int) -> tuple[int, int]:
        cost = self.cost(coll, nbytes)
        best = min((v, a, p) for a, row in enumerate(cost) for p, v in enumerate(row) if v >= 0)
        return best[1], best[2]

    def mean_us(self, coll: int, nbytes: int, algo: int, proto: int) -> float:
        est = self.cost(coll, nbytes)[algo][proto]
        return est * (NCCL_SLOWER if (algo, proto) == self.pick(coll, nbytes) else 1.0)


class Rank:
    """One training process of one pod: its own copy of the plugin, two communicators of the
    uncovered shape (say its data-parallel and its context-parallel group)."""

    def __init__(self, tmp_path: Path, name: str, shm_path: Path, mp: pytest.MonkeyPatch) -> None:
        mp.setenv("DYNAMICCL_SHM_PATH", str(shm_path))  # read when the tuner maps the file
        so = tmp_path / f"{name}.so"
        so.write_bytes(default_so().read_bytes())
        plugin = Plugin(so)
        self.comms = {
            cid: (
                Comm(plugin, 5, NRANKS, NNODES, comm_id=cid),
                ProfiledComm(plugin, 5, NRANKS, NNODES, comm_id=cid),
            )
            for cid in COMM_IDS
        }
        self.played: dict[int, list[Played]] = {cid: [] for cid in COMM_IDS}
        self.jitter = random.Random(name)

    def play(self, surface: Surface, n: int) -> None:
        def time_fn(c: int, nbytes: int, a: int, p: int, k: int) -> float:
            return surface.mean_us(c, nbytes, a, p) * self.jitter.lognormvariate(0, 0.03)

        for cid, (comm, prof) in self.comms.items():
            start = len(self.played[cid])
            calls = [(4, SIZES[i % 2]) for i in range(start, start + n)]
            self.played[cid] += play(
                comm, calls, time_fn, profiler=prof, cost_fn=surface.cost, default_channels=2
            )


def _pod(
    config_dir: ConfigDir, tmp_path: Path, name: str, backends: Backends, clock: object
) -> Runner:
    d = config_dir(table_json=learned_table(8, 2).model_dump(mode="json"))
    env = {
        "DYNAMICCL_POD_NAME": f"llm-worker-{name}",
        "DYNAMICCL_POD_UID": f"pod-uid-{name}",
        "DYNAMICCL_SHM_PATH": str(tmp_path / name / "dynamiccl.shm"),
        "DYNAMICCL_EPOCH_INTERVAL": str(L),
    }
    cfg = load(d, env, voters=2, procs_per_pod=1, state_dir=tmp_path / name / "state")
    return Runner(
        cfg,
        backends=backends,
        # a lead of 8 intervals: each rank plays one interval a round, so no rank ever
        # reaches a boundary whose votes are still open (one thread: it would wait forever)
        options=Options(coordination=Settings(min_lead=8, min_interval_s=0.0, lead_time_s=0.0)),
        clock=clock,  # type: ignore[arg-type]
    )


def _latest(runner: Runner) -> DecisionTable | None:
    assert runner.coordination is not None
    view = runner.coordination.history.latest
    return view.table if view is not None else None


def _tuned(table: DecisionTable | None, surface: Surface, scale: int) -> bool:
    """Every bucket's cell of the shape has a first choice other than NCCL's pick."""
    if table is None:
        return False
    for nbytes in SIZES:
        cell = table.cell(Collective.ALLREDUCE, nbytes.bit_length() - 1, scale)
        if cell is None or not cell.choices:
            return False
        if (cell.choices[0].algo.nccl_id, cell.choices[0].proto.nccl_id) == surface.pick(4, nbytes):
            return False
    return True


def test_an_uncovered_shape_is_tuned_online_and_every_rank_takes_the_same_decision(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    surface = Surface()
    scale = scale_class(NRANKS, NNODES)
    assert scale not in learned_table(8, 2).scales  # the job's table does not cover the shape
    coord = tmp_path / "coord"
    backends = Backends(
        FileCAS(coord / "record.json"), FileCAS(coord / "lease.json"), DirTableStore(coord / "t")
    )
    ticks = itertools.count(0.0, 0.05)  # every reading of any sidecar's clock: 50 ms later
    runners = [_pod(config_dir, tmp_path, n, backends, lambda: next(ticks)) for n in "ab"]
    ranks = [
        Rank(tmp_path, n, r.cfg.shm_path, monkeypatch) for n, r in zip("ab", runners, strict=True)
    ]
    done_at = None
    for rnd in range(MAX_ROUNDS):
        for rank in ranks:
            rank.play(surface, L)
        for r in runners:
            r.drain_once()
        for _ in range(3):
            for r in runners:
                assert r.coordination is not None
                r.coordination.step()
        if done_at is None and all(_tuned(_latest(r), surface, scale) for r in runners):
            done_at = rnd
        if done_at is not None and rnd >= done_at + 12:  # past the new table's boundary
            break
    summaries = [r.summary() for r in runners]
    for r in runners:
        r.close()
    assert done_at is not None, summaries

    # the shape was measured and learned: a cell of its scale class in the committed table,
    # its first choice not NCCL's pick, the same table on both pods
    tables = [_latest(r) for r in runners]
    assert tables[0] == tables[1]
    assert tables[0] is not None
    assert scale in tables[0].scales
    leader = next(s for s in summaries if s["leader"])
    assert leader["online_shapes"] == [[NRANKS, NNODES, scale]]
    lead = next(r for r, s in zip(runners, summaries, strict=True) if s["leader"])
    online = {"state": "online"}
    assert lead.metrics.registry.get_sample_value("dynamiccl_agent_online_shapes", online) == 1

    # every rank took the same decision at every call of each communicator, exploration
    # included; the two communicators share the cell but draw their exploration each from
    # its own commId
    for cid in COMM_IDS:
        runs = [[(p.algo, p.proto, p.nchannels) for p in rank.played[cid]] for rank in ranks]
        assert runs[0] == runs[1]
    a, b = (ranks[0].played[cid] for cid in COMM_IDS)
    assert [(p.algo, p.proto) for p in a] != [(p.algo, p.proto) for p in b]

    # at the end the plugin forces the learned choice, not NCCL's pick, and it is faster
    for cid, nbytes in itertools.product(COMM_IDS, SIZES):
        nccl = surface.pick(4, nbytes)
        calls = [p for p in ranks[0].played[cid][-4 * L :] if p.nbytes == nbytes]
        ran = [(p.algo, p.proto) for p in calls]
        cell = tables[0].cell(Collective.ALLREDUCE, nbytes.bit_length() - 1, scale)
        assert cell is not None
        first = (cell.choices[0].algo.nccl_id, cell.choices[0].proto.nccl_id)
        assert ran.count(first) > len(ran) // 2, (nbytes, first, ran[:20])
        assert ran.count(nccl) < len(ran) // 4
        mean = sum(p.time_us for p in calls) / len(calls)
        assert mean < surface.mean_us(4, nbytes, *nccl)

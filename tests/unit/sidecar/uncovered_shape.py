"""Two pods of one job tuning a communicator shape no table covers: the setup that
test_shapes_online.py and benchmarks/uncovered_shape_bench.py share.

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
from collections.abc import Callable, Sequence
from pathlib import Path

from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import DecisionTable, scale_class
from dynamiccl.sidecar.cas import FileCAS
from dynamiccl.sidecar.config import load
from dynamiccl.sidecar.proposer import DirTableStore
from dynamiccl.sidecar.runner import Options, Runner
from dynamiccl.sidecar.shapes import ShapeDefaults
from dynamiccl.sidecar.table_changes import Backends, Settings
from dynamiccl.testing.nccl_player import Comm, Played, Plugin, ProfiledComm, default_so, play
from tests.unit.sidecar.conftest import ConfigDir, features, learned_table

L = 256  # calls per communicator per round: one epoch interval
NRANKS, NNODES = 2, 2  # one rank on each of the job's 2 nodes: a data-parallel group
COMM_IDS = (0xD0D0, 0xC0C0)  # NCCL's commIds: each the same on every rank of its communicator
SIZES = (1 << 20, 1 << 24)  # all-reduce calls of two size buckets, alternating
NCCL_SLOWER = 1.6


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
    uncovered shape (say its data-parallel and its context-parallel group). `setenv` sets
    the process environment the plugin reads (pytest's monkeypatch.setenv)."""

    def __init__(
        self, root: Path, name: str, shm_path: Path, setenv: Callable[[str, str], None]
    ) -> None:
        setenv("DYNAMICCL_SHM_PATH", str(shm_path))  # read when the tuner maps the file
        so = root / f"{name}.so"
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


def pod(config_dir: ConfigDir, root: Path, name: str, backends: Backends, clock: object) -> Runner:
    """The sidecar of pod `name`, its job's table the learned one of 8 ranks on 2 nodes."""
    d = config_dir(table_json=learned_table(8, 2).model_dump(mode="json"))
    env = {
        "DYNAMICCL_POD_NAME": f"llm-worker-{name}",
        "DYNAMICCL_POD_UID": f"pod-uid-{name}",
        "DYNAMICCL_SHM_PATH": str(root / name / "dynamiccl.shm"),
        "DYNAMICCL_EPOCH_INTERVAL": str(L),
    }
    cfg = load(d, env, voters=2, procs_per_pod=1, state_dir=root / name / "state")
    return Runner(
        cfg,
        backends=backends,
        # a lead of 8 intervals: each rank plays one interval a round, so no rank ever
        # reaches a boundary whose votes are still open (one thread: it would wait forever)
        options=Options(coordination=Settings(min_lead=8, min_interval_s=0.0, lead_time_s=0.0)),
        clock=clock,  # type: ignore[arg-type]
    )


def latest(runner: Runner) -> DecisionTable | None:
    """The table the pod's coordination committed last (None: none yet)."""
    assert runner.coordination is not None
    view = runner.coordination.history.latest
    return view.table if view is not None else None


def tuned(table: DecisionTable | None, surface: Surface, scale: int) -> bool:
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


class Job:
    """Pods "a" and "b" on shared file-CAS backends, one rank each (named `rank_names`:
    their jitter's seeds); every reading of any sidecar's clock is 50 ms later."""

    def __init__(
        self,
        config_dir: ConfigDir,
        root: Path,
        setenv: Callable[[str, str], None],
        rank_names: Sequence[str] = ("a", "b"),
    ) -> None:
        self.surface = Surface()
        self.scale = scale_class(NRANKS, NNODES)
        coord = root / "coord"
        backends = Backends(
            FileCAS(coord / "record.json"),
            FileCAS(coord / "lease.json"),
            DirTableStore(coord / "t"),
        )
        ticks = itertools.count(0.0, 0.05)
        self.runners = [pod(config_dir, root, n, backends, lambda: next(ticks)) for n in "ab"]
        self.ranks = [
            Rank(root, n, r.cfg.shm_path, setenv)
            for n, r in zip(rank_names, self.runners, strict=True)
        ]

    def round(self) -> None:
        """Each rank plays one interval; each sidecar drains, then 3 coordination steps."""
        for rank in self.ranks:
            rank.play(self.surface, L)
        for r in self.runners:
            r.drain_once()
        for _ in range(3):
            for r in self.runners:
                assert r.coordination is not None
                r.coordination.step()

    def tuned(self) -> bool:
        """Every pod's committed table has learned the shape (`tuned`)."""
        return all(tuned(latest(r), self.surface, self.scale) for r in self.runners)

    def close(self) -> None:
        for r in self.runners:
            r.close()

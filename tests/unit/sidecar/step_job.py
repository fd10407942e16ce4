"""A DDP job whose training step the sidecar times: the setup of test_step_judge_loop.py.

Real pieces: the plugin `.so` (a private copy, driven through ctypes in NCCL's call
order: getCollInfo per collective, profiler Coll and KernelCh events with GPU
timestamps), the shared-memory file, a complete sidecar (`Runner`: ring reader, step
detector, step judge, online tuner, epoch protocol over file CAS backends).

The one stand-in for NCCL and the GPU is the product's step model
(policy/sim/step.py) with its bucket times from the product's simulator (8x H200,
tree / LL128, one 25 MiB DDP bucket: 575 us at 8 channels, 434 us at 12 and more):
each step the rank all-reduces `BUCKETS` buckets during the backward pass; the plugin
decides each bucket's configuration; the step lasts what the model says for those
bucket times at their channel count (a step mixing channel counts, as exploration does,
at the mean channel count weighted by bucket time, rounded), with 0.3 % jitter; each
call's GPU start is placed in that step (the step detector reads it). The user runs
tree / LL128 (NCCL_ALGO, NCCL_PROTO: the only entries of NCCL's cost table), at NCCL's 8
channels; the job's table commits that and lets the tuner explore the channel count.
"""

from __future__ import annotations

import functools
import itertools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.sim.step import step_time
from dynamiccl.sidecar.cas import FileCAS
from dynamiccl.sidecar.config import load
from dynamiccl.sidecar.proposer import DirTableStore
from dynamiccl.sidecar.runner import Options, Runner
from dynamiccl.sidecar.table_changes import Backends, Settings
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so
from tests.unit.sidecar.conftest import ConfigDir, exploration, features

L = 256  # epoch interval (calls)
NRANKS, NNODES = 8, 1
BUCKET = 25 << 20
BUCKETS = 24
STEPS_PER_ROUND = 10  # 240 calls: never past the lead of 8 intervals
DEFAULT_CHANNELS = 8  # NCCL's channel count where the plugin leaves it
TREE, LL128 = Algo.TREE.nccl_id, Proto.LL128.nccl_id
COMM_ID = 0xDD9


@dataclass(frozen=True)
class Regime:
    """A job's compute: `compute_us` per step, the share `overlap` of it in the backward pass."""

    compute_us: float
    overlap: float


OVERLAP_BOUND = Regime(18_000.0, 0.75)
COMM_BOUND = Regime(4_000.0, 0.6)


@functools.cache
def bucket_us(nch: int) -> float:
    """One bucket's all-reduce on tree / LL128 at `nch` channels (the simulator)."""
    sim = Simulator(calibration_system("dgx-h200"))
    return float(sim.times(Collective.ALLREDUCE.nccl_id, BUCKET, TREE, LL128, nch=nch)[0])


def model_step_us(regime: Regime, channels: list[int]) -> float:
    """The step model's step with these buckets' channel counts."""
    times = [bucket_us(c) for c in channels]
    mean = round(sum(t * c for t, c in zip(times, channels, strict=True)) / sum(times))
    return step_time(regime.compute_us, sum(times), regime.overlap, mean, gpu="H200").step_us


def table() -> DecisionTable:
    """The job's table: tree / LL128 at 8 channels, 32 channels a candidate."""
    sc = scale_class(NRANKS, NNODES)
    cell = Cell(
        collective=Collective.ALLREDUCE,
        bucket=BUCKET.bit_length() - 1,
        scale=sc,
        choices=(Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=DEFAULT_CHANNELS),),
        candidates=(Candidate(algo=Algo.TREE, proto=Proto.LL128, nchannels=32, weight=100),),
        explore=0.25,
    )
    return DecisionTable(
        version=1, scales=(sc,), cells=(cell,), explore=ExploreSchedule(seed=3, half_life_log2=8)
    )


def finding_table(nch: int = 32) -> DecisionTable:
    """A job's table from a cluster finding (docs/learning-loop.md): the finding, tree / LL128
    at `nch` channels, committed from the first epoch; NCCL's own pair the one candidate
    at 1/256."""
    base = table()
    cell = base.cells[0].model_copy(
        update={
            "choices": (Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=nch),),
            "candidates": (Candidate(algo=Algo.TREE, proto=Proto.LL128, weight=1),),
            "explore": 1 / 256,
        }
    )
    return base.model_copy(update={"cells": (cell,)})


def _cost(_coll: int, _nbytes: int) -> list[list[float]]:
    t = [[-1.0] * 3 for _ in range(7)]
    t[TREE][LL128] = 1.0  # NCCL_ALGO=tree NCCL_PROTO=LL128: the only entry
    return t


def _features() -> dict[str, object]:
    f = features(replicas=1, nproc=NRANKS).model_dump(mode="json")
    f["topology"]["nvls"] = False
    return f


def _exploration() -> dict[str, object]:
    e = exploration()
    # a budget of calls longer than the budget guard's first closed stretch (its first
    # window of credit: sidecar/explore_budget.py), so the tuner explores once the guard opens
    e["exploration"] = {**e["exploration"], "budgetCalls": 20_000, "budgetPercent": 5.0}
    e["constraints"] = {"allowed_algorithms": ["tree"], "allowed_protocols": ["LL128"]}
    return e


class StepJob:
    """One pod, one rank, one data-parallel communicator; `judge` False: the step judge
    never runs (kernel time alone decides, the code path before issue 31)."""

    def __init__(
        self,
        config_dir: ConfigDir,
        root: Path,
        setenv: Callable[[str, str], None],
        regime: Regime,
        *,
        judge: bool = True,
        pattern: bool = True,
        initial: DecisionTable | None = None,
    ) -> None:
        """`initial`: the job's table (default `table()`)."""
        self.regime, self.pattern = regime, pattern
        d = config_dir(
            table_json=(initial or table()).model_dump(mode="json"),
            features_json=_features(),
            exploration_json=_exploration(),
        )
        env = {
            "DYNAMICCL_POD_NAME": "ddp-0",
            "DYNAMICCL_POD_UID": "ddp-uid-0",
            "DYNAMICCL_SHM_PATH": str(root / "dynamiccl.shm"),
            "DYNAMICCL_EPOCH_INTERVAL": str(L),
        }
        cfg = load(d, env, procs_per_pod=1, state_dir=root / "state")
        coord = root / "coord"
        backends = Backends(
            FileCAS(coord / "record.json"),
            FileCAS(coord / "lease.json"),
            DirTableStore(coord / "t"),
        )
        ticks = itertools.count(0.0, 0.05)
        self.runner = Runner(
            cfg,
            backends=backends,
            options=Options(coordination=Settings(min_lead=8, min_interval_s=0.0, lead_time_s=0.0)),
            clock=lambda: next(ticks),
        )
        if not judge:
            self.runner.steps.check = list  # type: ignore[method-assign]
        setenv("DYNAMICCL_SHM_PATH", str(cfg.shm_path))
        so = root / "rank.so"
        so.write_bytes(default_so().read_bytes())
        plugin = Plugin(so)
        self.comm = Comm(plugin, 5, NRANKS, NNODES, comm_id=COMM_ID)
        self.prof = ProfiledComm(plugin, 5, NRANKS, NNODES, comm_id=COMM_ID)
        self.jitter = random.Random(7)
        self.clock_ns = 10**9
        self.step_us: list[float] = []  # every step the rank ran
        self.kernel_us: list[float] = []  # every call's all-reduce time

    def _sizes(self) -> list[int]:
        if self.pattern:
            return [BUCKET] * BUCKETS
        return [BUCKET >> self.jitter.randrange(0, 6) for _ in range(BUCKETS)]

    def play_step(self) -> None:
        """One training step: the plugin picks each bucket's configuration, the model times it."""
        sizes = self._sizes()
        picks = [self.comm.get_coll_info(4, n, _cost(4, n)) for n in sizes]
        channels = [p.nchannels or DEFAULT_CHANNELS for p in picks]
        step = model_step_us(self.regime, channels) * self.jitter.gauss(1.0, 0.003)
        pre = (1.0 - self.regime.overlap) * self.regime.compute_us
        for k, (n, p, c) in enumerate(zip(sizes, picks, channels, strict=True)):
            t = bucket_us(c) * (n / BUCKET)
            self.prof.gpu_clock_ns = self.clock_ns + int(1e3 * (pre + k * (step - pre) / BUCKETS))
            self.prof.collective(4, n // 4, b"ncclFloat32", p.algo, p.proto, c, t)
            self.kernel_us.append(t)
        self.clock_ns += int(step * 1e3)
        self.step_us.append(step)

    def round(self) -> None:
        for _ in range(STEPS_PER_ROUND):
            self.play_step()
        self.runner.drain_once()
        assert self.runner.coordination is not None
        for _ in range(3):
            self.runner.coordination.step()

    def last_steps_us(self, n: int) -> float:
        return statistics.median(self.step_us[-n:])

    def last_kernel_us(self, n: int) -> float:
        return statistics.median(self.kernel_us[-n:])

    def committed_channels(self) -> int | None:
        """The channel count the latest committed table commits in the cell."""
        assert self.runner.coordination is not None
        view = self.runner.coordination.history.latest
        if view is None:
            return None
        cell = view.table.cells[0]
        return cell.choices[0].nchannels if cell.choices else None

    def close(self) -> None:
        self.runner.close()

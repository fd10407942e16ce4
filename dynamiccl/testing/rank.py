"""One rank of the demo's training job: a process that plays NCCL against the real plugin.

Run as `python -m dynamiccl.testing.rank ARGS.json`. The process environment is
the training container's as the webhook mutated it (`NCCL_TUNER_PLUGIN`,
`NCCL_PROFILER_PLUGIN`, `DYNAMICCL_SHM_PATH`, with the pod's volumes mapped to
local directories). For every collective of every training step it does what
NCCL does (`dynamiccl.testing.nccl_player.play_call`): passes NCCL's cost table to the plugin's
`getCollInfo`, takes NCCL's resulting choice (and `getChunkSize`), "runs" it
for the simulated time of that configuration (`workload.TimeTable`, with
jitter shared by all ranks) and reports the GPU timestamps through the
plugin's profiler ABI, which puts one record per collective into the ring the
sidecar drains.

The harness spends CPU where a GPU would spend GPU time, so on the demo's two
cores the ranks would starve the sidecars, which in a real pod run beside
GPU-bound ranks. The rank processes therefore run at a lower CPU priority
(nice 10), and a rank waits whenever its profiler ring is half full (the plugin
itself never waits: a full ring drops records, counted).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict

from dynamiccl import constants as c
from dynamiccl.sidecar.shm import RING_CAP, ShmError, ShmFile
from dynamiccl.testing.nccl_player import Choice, Comm, Plugin, ProfiledComm, play_call
from dynamiccl.testing.workload import Jitter, TimeTable, call_key

TUNER_VERSION: Final = 6  # NCCL 2.27+ (with getChunkSize)
PROFILER_VERSION: Final = 5
BACKPRESSURE_CHECK: Final = 16  # calls between ring checks


class RankArgs(BaseModel):
    """What the launcher tells one rank process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    nranks: int
    nnodes: int
    comm_id: int
    steps: int
    ops: list[tuple[int, int, int]]  # (collective, nbytes, repeat) per step
    time_table: str
    seed: int
    out: str
    progress: str
    stop: str  # a file whose existence aborts the run
    barrier: str  # a directory every rank of the communicator checks in to after init


class RankReport(BaseModel):
    """What one rank did (written to `RankArgs.out`)."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    calls: int
    seconds: float
    decisions: dict[str, dict[str, int]]  # call key -> "algo:proto:nch:chunk" -> calls
    time_us: dict[str, float]  # call key -> sum of simulated times
    mapped: bool
    boundary_waits: int
    backpressure_s: float
    log: list[str]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class _Ring:
    """This process's profiler ring in the shared-memory file (for backpressure only)."""

    def __init__(self) -> None:
        self._shm: ShmFile | None = None
        self._slot: int | None = None
        self.waited_s = 0.0

    def _find(self) -> None:
        path = os.environ.get(c.ENV_SHM_PATH, "")
        if self._shm is None and path:
            try:
                self._shm = ShmFile(Path(path))
            except (ShmError, ValueError):
                return
        if self._shm is not None:
            mine = [p.index for p in self._shm.procs() if p.pid == os.getpid()]
            self._slot = mine[0] if mine else None

    def wait_for_room(self) -> None:
        """Sleep while the ring is more than half full (at most 5 s)."""
        if self._slot is None:
            self._find()
        if self._shm is None or self._slot is None:
            return
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0:
            head, tail, _ = self._shm.ring_counters(self._slot)
            if head - tail <= RING_CAP // 2:
                break
            time.sleep(0.002)
        self.waited_s += time.monotonic() - t0


def init_barrier(directory: Path, rank: int, nranks: int, timeout_s: float = 300.0) -> None:
    """Wait until every rank initialised its communicator (`ncclCommInitRank` is collective)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(rank)).touch()
    deadline = time.monotonic() + timeout_s
    while sum(1 for _ in directory.iterdir()) < nranks:
        if time.monotonic() > deadline:
            raise RuntimeError(f"communicator init: not every rank of {nranks} arrived")
        time.sleep(0.02)


def run(args: RankArgs) -> RankReport:
    """Play the job's steps; returns the report."""
    table = TimeTable.read(Path(args.time_table))
    plugin = Plugin(Path(os.environ[c.ENV_NCCL_TUNER_PLUGIN]))
    comm = Comm(plugin, TUNER_VERSION, args.nranks, args.nnodes, comm_id=args.comm_id)
    prof = ProfiledComm(
        plugin, PROFILER_VERSION, args.nranks, args.nnodes, comm_id=args.comm_id, rank=args.rank
    )
    init_barrier(Path(args.barrier), args.rank, args.nranks)
    jitter = Jitter(args.seed)

    def time_of(ch: Choice) -> float:
        mean = table.time_us(ch.coll, ch.nbytes, ch.algo, ch.proto, ch.plugin_channels, ch.chunk)
        if mean is None:
            raise RuntimeError(f"no simulated time for {ch}")
        return mean * jitter()

    def nccl(coll: int, nbytes: int, algo: int, proto: int) -> int:
        return table.nccl_channels[f"{coll}:{nbytes}:{algo}:{proto}"]

    ring = _Ring()
    decisions: dict[str, Counter[str]] = {}
    time_sum: dict[str, float] = defaultdict(float)
    progress, stop = Path(args.progress), Path(args.stop)
    calls = 0
    t0 = time.monotonic()
    for step in range(args.steps):
        for coll, nbytes, repeat in args.ops:
            key = call_key(coll, nbytes)
            cost = table.cost[key]
            for _ in range(repeat):
                ch = play_call(comm, coll, nbytes, cost, time_of, prof, channels=nccl, chunk=True)
                decisions.setdefault(key, Counter())[
                    f"{ch.algo}:{ch.proto}:{ch.plugin_channels}:{ch.chunk}"
                ] += 1
                time_sum[key] += ch.time_us
                calls += 1
                if calls % BACKPRESSURE_CHECK == 0:
                    ring.wait_for_room()
        if step % 25 == 24:
            _write(progress, str(calls))
            if stop.exists():
                break
    _write(progress, str(calls))
    comm.finalize()
    prof.finalize()
    logs = [m for _, m in plugin.logs]
    return RankReport(
        rank=args.rank,
        calls=calls,
        seconds=time.monotonic() - t0,
        decisions={k: dict(v) for k, v in decisions.items()},
        time_us=dict(time_sum),
        mapped=any("using " in m for m in logs),
        boundary_waits=sum("waits for the outcome" in m for m in logs),
        backpressure_s=ring.waited_s,
        log=logs[:20],
    )


def main(argv: list[str]) -> int:
    """Entry point: `python -m dynamiccl.testing.rank ARGS.json`."""
    os.nice(10)  # the GPU's work, played on the CPU, must not starve the sidecar
    args = RankArgs.model_validate_json(Path(argv[0]).read_text())
    report = run(args)
    _write(Path(args.out), report.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

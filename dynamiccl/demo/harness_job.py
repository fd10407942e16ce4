"""One job of the harness-played cluster: the real plugin `.so`, the sidecar's pieces, the ingest.

What is real: the plugin (a fresh copy of `libnccl-tuner-dynamiccl.so` per job,
driven through `agent/harness.py` the way NCCL drives it: `getCollInfo` with
NCCL's cost table, profiler `Coll` / `KernelCh` events with the GPU times), its
shared-memory file and table slots, the sidecar's attribution, aggregation,
NCCL baseline, reward records and exploration budget (`agent/exploration.py`),
and the HTTPS post of each `RewardBatch` to the ingest (the sidecar's `Client`).

Stand-ins (said where they matter):
- one rank plays the communicator: every rank decides identically by design
  (docs/architecture.md, 'Invariants'), so the other ranks' calls would be copies;
- the epoch protocol is collapsed to its outcome: the job's table without
  exploration is committed as epoch 1 at the first boundary (the budget's gate
  starts closed), and whenever the gate opens or closes (`BudgetGuard`, looked
  at every drain) the table with or without exploration is committed as the
  next epoch at the second boundary after it (what the leader's proposal and
  the votes would decide);
- no online tuner re-plans cells inside the job: a job runs its assignment
  (the in-job tuner is tested in tests/unit/agent/test_tuning.py);
- times come from `Surface` (the simulator with a departure), not from GPUs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl.agent import shm as shmlib
from dynamiccl.agent import shm_table
from dynamiccl.agent.aggregate import Aggregator, Key, to_record
from dynamiccl.agent.attribution import History, TableView, attribute
from dynamiccl.agent.baseline import Baseline, NcclDefaults
from dynamiccl.agent.exploration import BudgetGuard, max_explore, without_exploration
from dynamiccl.agent.harness import Comm, Plugin, ProfiledComm, default_so
from dynamiccl.agent.ring import RingReader
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.rewards import MAX_RECORDS_PER_BATCH, JobRef, PodRef, RewardBatch
from dynamiccl.api.table import DecisionTable
from dynamiccl.demo.surface import Surface

EPOCH_INTERVAL: Final = 64
DRAIN_EVERY: Final = 256  # calls between two drains (the ring holds 1024)
# Calls that may explore after the budget's gate closes: to the next drain, then the boundary.
WINDOW_CALLS: Final = DRAIN_EVERY + 2 * EPOCH_INTERVAL
TUNER_VERSION: Final = 5
PROFILER_VERSION: Final = 5

Post = Callable[[bytes], int]  # one batch's JSON -> HTTP status


@dataclass(frozen=True)
class JobSpec:
    """A job of the sequence: identity, shape, workload, model version."""

    namespace: str
    name: str
    uid: str
    pod_name: str
    pod_uid: str
    model_version: str
    features: StateFeatures
    step: Sequence[tuple[int, int]]  # (collective, nbytes) per call of a training step
    calls: int

    @property
    def nranks(self) -> int:
        return self.features.world_size

    @property
    def nnodes(self) -> int:
        return self.features.topology.nodes


@dataclass
class Played:
    """What the job's sidecar measured and sent."""

    calls: int
    batches: int
    records: int
    budget: dict[str, Any]
    stopped_exploring_at: int | None


class _Sidecar:
    """The sidecar's measuring half for one pod: attribute, aggregate, baseline, budget."""

    def __init__(self, job: JobSpec, table: DecisionTable, budget_percent: float) -> None:
        self.job = job
        self.epochs: list[tuple[int, TableView]] = []
        self.history = History(self.epochs)
        self.agg = Aggregator()
        self.baseline = Baseline(NcclDefaults(job.features))
        self.guard = BudgetGuard(
            budget_percent, window_calls=WINDOW_CALLS, rate_prior=max_explore(table)
        )

    def fold(self, f: shmlib.ShmFile, reader: RingReader) -> int:
        """Read, attribute and fold every ring's new records, then consume them (as runner.py)."""
        comms = f.comms()
        n = 0
        used, _heads, _drops = reader.scan()
        for slot in used:
            batch = reader.read(slot, reader.tail(slot))
            for r in batch.records:
                nranks, nnodes = comms[r.comm_id]
                t_us = r.exec_ns / 1000.0
                a = attribute(
                    self.history, r.coll, r.nbytes, nranks, nnodes, r.coll_seq,
                    r.algo, r.proto, r.nchannels,
                )  # fmt: skip
                key = Key(a.table_version, r.coll, a.bucket, nranks, nnodes, *a.arm, a.origin)
                self.agg.add(key, r.nbytes, t_us)
                cell = (r.coll, a.bucket, nranks, nnodes)
                if self.baseline.is_default(cell, a.arm, a.origin != "default"):
                    self.baseline.observe(cell, t_us)
                self.guard.observe(cell, a.origin, t_us)
                n += 1
            reader.consume(slot, batch.end)
        return n

    def commit(self, f: shmlib.ShmFile, table: DecisionTable, at_call: int | None) -> int:
        """Commit `table` (as the next epoch and version) at the second boundary after
        `at_call` (None: the first boundary), what the leader's proposal and the votes
        would decide; returns the boundary."""
        epoch = len(self.epochs) + 1
        t = table.model_copy(update={"version": epoch})
        boundary = EPOCH_INTERVAL
        if at_call is not None:
            boundary = (at_call // EPOCH_INTERVAL + 2) * EPOCH_INTERVAL
        f.write_table(epoch, shm_table.encode_table(t, epoch))
        f.set_entry(epoch, shmlib.EPOCH_COMMITTED, boundary)
        self.epochs.append((boundary, TableView(t)))
        self.history = History(self.epochs)
        return boundary

    def batches(self) -> list[RewardBatch]:
        j = self.job
        out: list[RewardBatch] = []
        for v in self.agg.versions():
            while True:
                items = self.agg.take(MAX_RECORDS_PER_BATCH, table_version=v)
                if not items:
                    break
                base = self.baseline
                records = [
                    to_record(
                        k, st, base.time_us((k.coll, k.bucket, k.nranks, k.nnodes), st.mean_us)
                    )
                    for k, st in items
                ]
                ref = JobRef(namespace=j.namespace, kind="PyTorchJob", name=j.name, uid=j.uid)
                out.append(
                    RewardBatch(
                        idempotency_key=f"{j.pod_uid}/{len(out) + 1}",
                        job=ref,
                        pod=PodRef(name=j.pod_name, uid=j.pod_uid),
                        model_version=j.model_version,
                        table_version=v,
                        records=tuple(records),
                    )
                )
        return out


@contextmanager
def _shm_env(shm: Path) -> Iterator[None]:
    """DYNAMICCL_SHM_PATH set for the job (the plugin reads it when a communicator starts)."""
    old = os.environ.get("DYNAMICCL_SHM_PATH")
    os.environ["DYNAMICCL_SHM_PATH"] = str(shm)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DYNAMICCL_SHM_PATH", None)
        else:
            os.environ["DYNAMICCL_SHM_PATH"] = old


def _plugin(work: Path) -> Plugin:
    """A fresh copy of the plugin: its own process state."""
    so = work / "libnccl-tuner-dynamiccl.so"
    shutil.copyfile(default_so(), so)
    return Plugin(so)


def play_job(
    job: JobSpec,
    table: DecisionTable,
    surface: Surface,
    work: Path,
    post: Post,
    *,
    budget_percent: float = 1.0,
) -> Played:
    """Run the job's calls through the plugin; send its rewards; what it measured."""
    work.mkdir(parents=True, exist_ok=True)
    shm = work / "dynamiccl.shm"
    shmlib.create(shm, EPOCH_INTERVAL)
    side = _Sidecar(job, table, budget_percent)
    bare = without_exploration(table)
    exploring = False  # the guard's gate starts closed: no credit before any collective time
    with shmlib.ShmFile(shm) as f, _shm_env(shm):
        reader = RingReader(shm)
        side.commit(f, bare, None)
        plugin = _plugin(work)
        comm = Comm(plugin, TUNER_VERSION, job.nranks, job.nnodes, comm_id=7)
        prof = ProfiledComm(plugin, PROFILER_VERSION, job.nranks, job.nnodes, comm_id=7)
        for i in range(job.calls):
            coll, nbytes = job.step[i % len(job.step)]
            info = comm.get_coll_info(coll, nbytes, surface.cost(coll, nbytes))
            nch = info.nchannels or surface.nccl_channels(coll, nbytes, info.algo, info.proto)
            t = surface.play_us(coll, nbytes, info.algo, info.proto, nch)
            count = max(nbytes // (4 * (job.nranks if coll in (2, 3) else 1)), 1)
            prof.collective(coll, count, b"ncclFloat32", info.algo, info.proto, nch, t)
            if (i + 1) % DRAIN_EVERY == 0:
                side.fold(f, reader)
                if side.guard.is_open != exploring:  # the gate flipped: the other table
                    exploring = side.guard.is_open
                    side.commit(f, table if exploring else bare, i + 1)
        side.fold(f, reader)
        comm.finalize()
        prof.finalize()
        reader.close()
    batches = side.batches()
    for b in batches:
        code = post(b.model_dump_json().encode())
        if code != 200:
            raise RuntimeError(f"ingest answered {code} for batch {b.idempotency_key}")
    return Played(
        calls=job.calls,
        batches=len(batches),
        records=sum(len(b.records) for b in batches),
        budget=side.guard.summary(),
        stopped_exploring_at=side.guard.stopped_at_call,
    )

"""One job of the harness-played cluster: the real plugin `.so` and the real sidecar.

What is real: the plugin (a fresh copy of `libnccl-tuner-dynamiccl.so` per job,
driven through `dynamiccl/testing/nccl_player.py` the way NCCL drives it: `getCollInfo` with
NCCL's cost table, profiler `Coll` / `KernelCh` events with the GPU times), its
shared-memory file, and the job's sidecar: `sidecar.runner.Runner`, configured
from the job's ConfigMap as the webhook mounts it (`sidecar.config.load`), with
the file coordination of `dynamiccl sidecar --coordination file:DIR`
(`sidecar.cli.file_backends`: the epoch record, lease and tables as files) and
its timing (`Settings.for_backend`). So every call is read, checked,
attributed (scale class included), folded into the aggregates, the NCCL
baseline, the online tuner and the exploration budget by the sidecar's own
`drain_once`; its `cut`s go through the spool's outbox and its `SendLoop` to
`client` (the sidecar's HTTPS `Client` to the ingest in the demo); and tables
reach the plugin only through the epoch protocol: the leader proposes the
job's table, later the tuner's (without exploration while the budget is
closed), the participant writes each into its slot and votes, the outcome is
mirrored into the file, and the plugin takes the table at the boundary.

Stand-ins:
- one rank plays the communicator, as the one process of the job's one pod
  (the sidecar is told 1 voter and 1 process per pod): every rank decides
  identically by design (docs/architecture.md, 'Invariants'), so the other
  ranks' calls would be copies;
- the sidecar's threads (drain and cut, coordination, sender) are stepped in
  the player's thread on the job's clock, at the intervals the real threads
  wait (`Options`, `Settings`), so a run is deterministic; the clock is the
  played calls' GPU time back to back (a job bound by its communication);
- where the plugin would wait at the boundary of a pending epoch, the clock
  moves on by coordination steps until the outcome is in the file (what the
  sidecar's thread does while the rank waits);
- times come from `Surface` (the simulator with a departure), not from GPUs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.epoch import EpochStatus
from dynamiccl.api.features import StateFeatures
from dynamiccl.sidecar import shm as shmlib
from dynamiccl.sidecar.cas import load_record
from dynamiccl.sidecar.cli import file_backends
from dynamiccl.sidecar.config import load
from dynamiccl.sidecar.runner import BUSY, Options, Runner
from dynamiccl.sidecar.sender import Poster
from dynamiccl.sidecar.table_changes import Settings
from dynamiccl.testing.nccl_player import (
    Comm,
    Plugin,
    ProfiledComm,
    by_choice,
    default_so,
    play_call,
)
from dynamiccl.testing.surface import Surface

TUNER_VERSION: Final = 5
PROFILER_VERSION: Final = 5
# `dynamiccl sidecar --coordination file:DIR`'s timing; a short send grace at the end (the demo's
# ingest is local: a batch it cannot take now is an error, not a network blip)
OPTIONS: Final = Options(coordination=Settings.for_backend(kube=False), send_grace_s=2.0)
MAX_WAIT_S: Final = 60.0  # of the job's clock at one boundary; the sidecar aborts after 4 s


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
    batches: int  # acknowledged by the ingest
    records: int
    budget: dict[str, Any]
    stopped_exploring_at: int | None
    epochs: int = 0  # committed by the epoch protocol
    proposed: int = 0  # epochs the sidecar proposed
    boundary_wait_s: float = 0.0  # the job's clock spent waiting at a pending epoch's boundary


@dataclass
class _Clock:
    """The job's clock: seconds of GPU time played so far (and of waits)."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class _Pod:
    """The job's pod: its sidecar's threads stepped on the job's clock."""

    def __init__(self, runner: Runner, clock: _Clock) -> None:
        self.r, self.clock = runner, clock
        assert runner.coordination is not None
        self.coordination = runner.coordination
        self.interval = runner.cfg.epoch_interval
        self.next_drain = self.next_step = clock.now
        self.waited_s = 0.0

    def advance(self, seconds: float) -> None:
        """`seconds` pass; every thread whose wait is over runs once."""
        self.clock.now += seconds
        now = self.clock.now
        if now >= self.next_step:
            self.r.coordinate_once()
            self.next_step = now + OPTIONS.coordination.step_s
        if now >= self.next_drain:
            n = self.r.drain_once()
            if self.r.cut():
                self.r.sender.drain(sleep=lambda _s: True)  # a failure: retried after the next cut
            self.next_drain = now if n >= BUSY else now + OPTIONS.drain_s

    def _waits_at(self, call: int) -> bool:
        """Would the plugin wait at call index `call`: an epoch of the record with its boundary
        at or before it whose outcome the shared-memory file does not hold yet?"""
        rec, _ = load_record(self.coordination.b.record)
        if rec is None:
            return False
        for ep in rec.epochs:
            if ep.boundary <= call and ep.status != EpochStatus.ABORTED:
                status, _k = self.r.shm.entry(ep.epoch)
                if status not in (shmlib.EPOCH_NONE, shmlib.EPOCH_COMMITTED, shmlib.EPOCH_ABORTED):
                    return True
        return False

    def boundary(self, call: int) -> None:
        """Before call index `call`: at a boundary, wait (the sidecar runs) while it is pending."""
        if call % self.interval:
            return
        step = OPTIONS.coordination.step_s
        start = self.clock.now
        while self._waits_at(call):
            if self.clock.now - start > MAX_WAIT_S:
                raise RuntimeError(f"call {call} waits for an epoch's outcome for good")
            self.advance(step)
        self.waited_s += self.clock.now - start


@contextmanager
def _shm_env(shm: Path) -> Iterator[None]:
    """DYNAMICCL_SHM_PATH set for the job (the plugin reads it when a communicator starts)."""
    old = os.environ.get(c.ENV_SHM_PATH)
    os.environ[c.ENV_SHM_PATH] = str(shm)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(c.ENV_SHM_PATH, None)
        else:
            os.environ[c.ENV_SHM_PATH] = old


def _plugin(work: Path) -> Plugin:
    """A fresh copy of the plugin: its own process state."""
    so = work / "libnccl-tuner-dynamiccl.so"
    shutil.copyfile(default_so(), so)
    return Plugin(so)


def sidecar(
    job: JobSpec, config: Mapping[str, str], work: Path, client: Poster, clock: _Clock
) -> Runner:
    """The pod's sidecar: the ConfigMap's keys mounted as files, file coordination."""
    mount = work / "config"
    mount.mkdir(parents=True, exist_ok=True)
    for key, text in config.items():
        (mount / key).write_text(text)
    cfg = load(
        mount, {}, shm_path=work / c.SHM_FILE_NAME, state_dir=work / "sidecar-state",
        pod_name=job.pod_name, pod_uid=job.pod_uid, voters=1, procs_per_pod=1,
    )  # fmt: skip
    if cfg.table is None:
        raise ValueError(f"job {job.name}: the ConfigMap holds no table ({cfg.table_reason})")
    backends = file_backends(work / "coordination" / cfg.job.uid)
    return Runner(cfg, backends=backends, options=OPTIONS, clock=clock, client=client)


def play_job(
    job: JobSpec, config: Mapping[str, str], surface: Surface, work: Path, client: Poster
) -> Played:
    """Run the job's calls through the plugin beside its sidecar (`config`: the data of the
    job's ConfigMap); the sidecar sends its rewards to `client`; what it measured."""
    work.mkdir(parents=True, exist_ok=True)
    clock = _Clock()
    runner = sidecar(job, config, work, client, clock)
    pod = _Pod(runner, clock)
    try:
        with _shm_env(runner.cfg.shm_path):
            plugin = _plugin(work)
            comm = Comm(plugin, TUNER_VERSION, job.nranks, job.nnodes, comm_id=7)
            prof = ProfiledComm(plugin, PROFILER_VERSION, job.nranks, job.nnodes, comm_id=7)
            time_of = by_choice(surface.play_us)
            for i in range(job.calls):
                pod.boundary(i)
                coll, nbytes = job.step[i % len(job.step)]
                cost = surface.cost(coll, nbytes)
                channels = surface.nccl_channels
                played = play_call(comm, coll, nbytes, cost, time_of, prof, channels=channels)
                pod.advance(played.time_us / 1e6)
            comm.finalize()
            prof.finalize()
        runner.shutdown()  # the kubelet stops the sidecar after training: drain, cut, send
        return _played(job, runner, pod)
    finally:
        runner.close()


def _played(job: JobSpec, runner: Runner, pod: _Pod) -> Played:
    left = runner.spool.outbox()
    refused = sorted(runner.spool.rejected_dir.glob("*.json"))
    if left or refused:
        raise RuntimeError(
            f"job {job.name}: {len(left)} batches unsent, {len(refused)} refused by the ingest"
            f" ({runner.sender.last_error or [p.name for p in refused]})"
        )
    sent, s = runner.spool.sent(), runner.summary()
    return Played(
        calls=job.calls,
        batches=sent.batches,
        records=sent.records,
        budget=runner.budget.summary(),
        stopped_exploring_at=runner.budget.stopped_at_call,
        epochs=int(s["committed_epochs"]),
        proposed=len(s["proposed_epochs"]),
        boundary_wait_s=round(pod.waited_s, 3),
    )

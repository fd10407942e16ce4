"""The sidecar loop in-process: real plugin (.so) records, real ingest app + SQLite store.

The ingest endpoint is the operator's aiohttp app with its TokenReview and
pod→job lookups replaced at their Protocol layer (the real ones are exercised
on the API server in tests/integration/sidecar/test_loop.py). Interruptions of the
sidecar are simulated by raising at each durable step and starting a new
`Runner` on the same directories: the store must end up with every played
call exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.experience import read_experience
from dynamiccl.api.rewards import JobRef, RewardBatch
from dynamiccl.operator.ingest.auth import Caller
from dynamiccl.operator.ingest.main import IngestService
from dynamiccl.operator.ingest.settings import IngestSettings
from dynamiccl.operator.store.experience import open_store
from dynamiccl.sidecar.config import AgentConfig, load
from dynamiccl.sidecar.runner import Options, Runner
from dynamiccl.sidecar.spool import Spool
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so, play
from tests.unit.sidecar.conftest import JOB, ConfigDir, exploration, features

POD, POD_UID = "llm-worker-0", "pod-uid-0"
JOB_REF = JobRef.model_validate({k: JOB[k] for k in ("namespace", "kind", "name", "uid")})
L = 256


class Reviewer:
    async def review(self, token: str, audience: str) -> Caller | None:
        if token != "tok" or audience != "dynamiccl-ingest":
            return None
        ns = str(JOB["namespace"])
        return Caller(
            f"system:serviceaccount:{ns}:trainer",
            ns,
            "trainer",
            POD,
            POD_UID,
        )


class Resolver:
    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        return JOB_REF if (pod_name, pod_uid) == (POD, POD_UID) else None


class Ingest:
    """The operator's ingest app on a background event loop (plain HTTP)."""

    def __init__(self, db: Path) -> None:
        self.url = f"sqlite:///{db}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        settings = IngestSettings(
            store_url=self.url, tls_cert=None, tls_key=None, host="127.0.0.1", port=0
        )
        self.svc = IngestService(settings, reviewer=Reviewer(), resolver=Resolver())
        port = asyncio.run_coroutine_threadsafe(self.svc.start(), self.loop).result(30)
        self.endpoint = f"http://127.0.0.1:{port}/v1/rewards"

    def stored(self) -> tuple[int, int]:
        s = open_store(self.url, migrate=False)
        try:
            return s.stored_calls(str(JOB["uid"])), s.batch_count()
        finally:
            s.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.svc.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[Ingest]:
    i = Ingest(tmp_path / "experience.db")
    yield i
    i.close()


def agent_config(config_dir: ConfigDir, tmp_path: Path, ingest: Ingest) -> AgentConfig:
    token = tmp_path / "token"
    token.write_text("tok")
    ex = exploration()
    # a budget this short job earns at once: the gate opens (sidecar/explore_budget.py) and the
    # table's exploration runs, which the storage tests look for
    ex["exploration"]["budgetPercent"] = 50.0
    d = config_dir(
        features_json=features(replicas=1, nproc=1).model_dump(mode="json"), exploration_json=ex
    )
    env = {
        "DYNAMICCL_POD_NAME": POD,
        "DYNAMICCL_POD_UID": POD_UID,
        "DYNAMICCL_INGEST_URL": ingest.endpoint,
        "DYNAMICCL_INGEST_TOKEN_FILE": str(token),
        "DYNAMICCL_SHM_PATH": str(tmp_path / "shm" / "dynamiccl.shm"),
        "DYNAMICCL_EPOCH_INTERVAL": str(L),
    }
    return load(d, env)


class Rank:
    """This test process as one training rank, through a private copy of the plugin."""

    def __init__(self, tmp_path: Path, shm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(shm_path))
        so = tmp_path / "rank.so"
        so.write_bytes(default_so().read_bytes())
        plugin = Plugin(so)
        self.comm = Comm(plugin, 5, 8, 2, comm_id=0x5EED)
        self.prof = ProfiledComm(plugin, 5, 8, 2, comm_id=0x5EED)
        self.played = 0

    def play(self, n: int) -> None:
        calls = [
            (4, (1 << 16, 1 << 20, 1 << 24)[i % 3]) for i in range(self.played, self.played + n)
        ]

        def time_fn(c: int, nbytes: int, a: int, p: int, k: int) -> float:
            return 5.0 + nbytes / 4e4 * (1.0 + 0.2 * a + 0.1 * p)

        play(self.comm, calls, time_fn, profiler=self.prof, cost_fn=lambda c, n: _cost())
        self.played += n


def _cost() -> list[list[float]]:
    t = [[-1.0] * 3 for _ in range(7)]
    t[0] = [9.0, 8.0, 7.0]
    t[1] = [6.0, 5.0, 4.0]
    return t


def test_every_played_call_is_stored_once_and_the_tables_take_effect(
    config_dir: ConfigDir, tmp_path: Path, ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynamiccl.sidecar.cas import FileCAS  # noqa: PLC0415
    from dynamiccl.sidecar.proposer import DirTableStore  # noqa: PLC0415
    from dynamiccl.sidecar.table_changes import Backends, Settings  # noqa: PLC0415

    cfg = agent_config(config_dir, tmp_path, ingest)
    coord = tmp_path / "coord"
    backends = Backends(
        FileCAS(coord / "r.json"), FileCAS(coord / "l.json"), DirTableStore(coord / "t")
    )
    ticks = itertools.count(0.0, 0.05)  # every reading of the clock: 50 ms later
    runner = Runner(
        cfg,
        backends=backends,
        # a fixed lead of 8 intervals: this single thread plays L calls a round and must
        # never reach a boundary whose votes are still open (the plugin would wait)
        options=Options(
            flush_s=0.0,
            coordination=Settings(min_lead=8, min_interval_s=0.0, lead_time_s=0.0),
        ),
        clock=lambda: next(ticks),
    )
    rank = Rank(tmp_path, cfg.shm_path, monkeypatch)
    assert runner.coordination is not None
    for _ in range(40):
        rank.play(L)  # never past the lead: the plugin never waits in this single thread
        runner.drain_once()
        runner.coordination.step()
        runner.coordination.step()
        runner.cut()
    runner.once()
    summary = runner.summary()
    runner.close()
    calls, batches = ingest.stored()
    assert calls == rank.played == summary["acknowledged_calls"]
    assert batches == summary["acknowledged_batches"]
    assert summary["committed_epochs"] >= 2  # the initial table, then the tuner's
    # NCCL's own choices before the first boundary, then the table's and the tuner's explorations
    rows = list(read_experience(ingest.url))
    assert {r.record.origin.value for r in rows} == {"default", "table", "explore"}
    assert {r.table_version for r in rows} >= {0, 1, 2}
    assert sum(r.record.count for r in rows) == rank.played


@pytest.mark.parametrize(
    "fail_at",
    [
        "consume",  # killed after the state was saved, before the ring was consumed
        "save",  # killed while folding: nothing saved, the ring not consumed
        "put_batch",  # killed during a cut, before its batch was written
        "cut_state",  # killed during a cut, after its batch, before the state
        "ack",  # killed after the acknowledgement, before the batch left the outbox
        "unsaved",  # killed while read records wait for the next save (ring not consumed)
    ],
)
def test_a_sidecar_killed_at_any_step_neither_loses_nor_duplicates(
    fail_at: str,
    config_dir: ConfigDir,
    tmp_path: Path,
    ingest: Ingest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = agent_config(config_dir, tmp_path, ingest)
    rank = Rank(tmp_path, cfg.shm_path, monkeypatch)

    class KilledError(Exception):
        pass

    def new(save_s: float = 0.0) -> Runner:
        return Runner(cfg, backends=None, options=Options(flush_s=0.0, save_s=save_s))

    r = new(1e9 if fail_at == "unsaved" else 0.0)
    rank.play(300)
    r.drain_once()
    r.cut()
    r.sender.drain()
    rank.play(500)
    with monkeypatch.context() as mp:
        if fail_at == "consume":
            mp.setattr(r.reader, "consume", _raise(KilledError))
            with pytest.raises(KilledError):
                r.drain_once()
        elif fail_at == "save":
            mp.setattr(r.spool, "save", _raise(KilledError))
            with pytest.raises(KilledError):
                r.drain_once()
        elif fail_at == "unsaved":
            mp.setattr("dynamiccl.sidecar.runner.CONSUME_AT", 10**9)
            assert r.drain_once() == 500
            assert r.reader.tail(r.reader.used_slots()[0]) == 300  # read, not consumed
        elif fail_at in ("put_batch", "cut_state"):
            r.drain_once()
            if fail_at == "put_batch":
                mp.setattr(r.spool, "put_batch", _raise(KilledError))
            else:
                mp.setattr(r.spool, "save", _raise(KilledError))
            with pytest.raises(KilledError):
                r.cut(force=True)
        else:
            r.drain_once()
            r.cut(force=True)
            real_unlink = Path.unlink

            def unlink(self: Path, *a: Any, **k: Any) -> None:
                if self.parent.name == "outbox":
                    raise KilledError
                real_unlink(self, *a, **k)

            mp.setattr(Path, "unlink", unlink)
            with pytest.raises(KilledError):
                r.sender.drain()
    r.close()
    rank.play(200)
    r2 = new()
    r2.once()
    r2.close()
    calls, _ = ingest.stored()
    assert calls == rank.played == 1000
    assert Spool(cfg.state_dir, POD_UID).sent().calls == 1000


def _raise(exc: type[Exception]) -> Any:
    def f(*_a: Any, **_k: Any) -> None:
        raise exc

    return f


def test_batches_are_valid_and_carry_the_pod_identity(
    config_dir: ConfigDir, tmp_path: Path, ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = agent_config(config_dir, tmp_path, ingest)
    cfg = cfg.model_copy(update={"ingest_url": ""})  # keep the batches in the outbox
    rank = Rank(tmp_path, cfg.shm_path, monkeypatch)
    r = Runner(cfg, backends=None, options=Options(flush_s=0.0))
    rank.play(100)
    r.once()
    (seq,) = r.spool.outbox()
    b = RewardBatch.model_validate_json(r.spool.read_batch(seq) or b"")
    assert b.idempotency_key == f"{POD_UID}/1"
    assert (b.pod.name, b.pod.uid, b.job) == (POD, POD_UID, JOB_REF)
    assert b.table_version == 0  # no epoch: NCCL's own choices
    assert {rec.origin.value for rec in b.records} == {"default"}
    assert sum(rec.count for rec in b.records) == 100
    assert {(rec.nranks, rec.nnodes) for rec in b.records} == {(8, 2)}
    r.close()

"""The stand-alone ingest process: argument checks and clean failures."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.ingest.cli import parse as _parse
from dynamiccl.operator.ingest.main import IngestService, main
from dynamiccl.operator.learning.leader import LeaderElector
from dynamiccl.operator.learning.loop import TickReport
from dynamiccl.testing.memory_api import MemoryAPI


def test_tls_is_required_unless_explicitly_insecure() -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(["--store", "x.db"])
    assert exc.value.code == 2
    s = _parse(["--store", "x.db", "--insecure-http", "--port", "0"])
    assert (s.tls_cert, s.port, s.audience) == (None, 0, "dynamiccl-ingest")
    s = _parse(["--store", "x.db", "--tls-cert", "c", "--tls-key", "k"])
    assert s.tls_cert == Path("c")


def test_learning_loop_flags() -> None:
    s = _parse(["--store", "x.db", "--insecure-http"])
    assert s.loop is None
    s = _parse(
        [
            "--store",
            "sqlite:////var/lib/dynamiccl/e.db",
            "--insecure-http",
            "--loop-namespace",
            "dynamiccl",
            "--loop-image",
            "img:1",
            "--loop-pvc",
            "store",
            "--loop-colocate-label",
            "app=ingest",
            "--loop-interval",
            "5",
        ]
    )
    assert s.loop is not None
    assert (s.loop.namespace, s.loop.image, s.loop.pvc_name) == ("dynamiccl", "img:1", "store")
    assert s.loop.store_url == "sqlite:////var/lib/dynamiccl/e.db"
    assert s.loop.colocate_with == {"app": "ingest"}
    assert s.loop.store_url_secret is None
    assert s.loop_interval_s == 5.0
    pg = ["--store", "postgresql://u:p@db/x", "--insecure-http", "--loop-namespace", "d"]
    s = _parse([*pg, "--loop-image", "i", "--loop-pvc", "p", "--loop-store-secret", "st"])
    assert s.loop is not None
    assert s.loop.store_url_secret == "st"
    for bad in (
        ["--loop-namespace", "x"],
        [
            "--loop-namespace",
            "x",
            "--loop-image",
            "i",
            "--loop-pvc",
            "p",
            "--loop-colocate-label",
            "novalue",
        ],
    ):
        with pytest.raises(SystemExit):
            _parse(["--store", "x.db", "--insecure-http", *bad])


def test_retention_flags_and_pass(tmp_path: Path) -> None:
    s = _parse(
        [
            "--store",
            str(tmp_path / "r.db"),
            "--insecure-http",
            "--retention-days",
            "2",
            "--retention-max-rows",
            "1",
        ]
    )
    assert (s.retention_max_age_s, s.retention_max_rows) == (172_800.0, 1)
    for bad in (["--retention-days", "0"], ["--retention-max-rows", "-1"]):
        with pytest.raises(SystemExit):
            _parse(["--store", "x.db", "--insecure-http", *bad])

    class NoAuth:
        async def review(self, token: str, audience: str) -> None:
            return None

        async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> None:
            return None

    svc = IngestService(s, reviewer=NoAuth(), resolver=NoAuth())
    try:
        for seq in range(3):
            svc.store.insert_batch(make(seq))
        assert svc.store.count_experience() == 3
        svc.apply_retention()
        assert svc.store.count_experience() == 1
    finally:
        svc.store.close()


def make(seq: int) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"p/{seq}",
            "job": {"namespace": "n", "kind": "PyTorchJob", "name": "j", "uid": "u"},
            "pod": {"name": "p", "uid": "p"},
            "model_version": "v",
            "table_version": 0,
            "records": [
                {
                    "collective": "broadcast",
                    "size_bucket": 1,
                    "nbytes_min": 2,
                    "nbytes_max": 3,
                    "nranks": 2,
                    "nnodes": 1,
                    "algo": "ring",
                    "proto": "ll",
                    "nchannels": 0,
                    "chunk_bytes": 0,
                    "origin": "default",
                    "count": 1,
                    "mean_time_us": 1.0,
                    "p50_time_us": 1.0,
                    "p99_time_us": 1.0,
                    "busbw_GBps": 0.0,
                    "nccl_default_time_us": 1.0,
                }
            ],
        }
    )


def test_bad_store_url_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", "mysql://nope", "--insecure-http", "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "store URL" in err[0]


def test_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # never contacted: no request carries a token
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.operator.ingest.main",
            "--store",
            str(tmp_path / "e.db"),
            "--insecure-http",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert '"port"' in line
        port = json.loads(line)["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.read() == b"ok"
        proc.terminate()
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_retraining_job_placement_flags() -> None:
    base = ["--store", "x.db", "--insecure-http", "--loop-namespace", "d", "--loop-image", "i"]
    s = _parse(
        [
            *base,
            "--loop-pvc",
            "p",
            "--loop-node-selector",
            "pool=ml",
            "--loop-toleration",
            '{"key": "k", "operator": "Exists", "effect": "NoSchedule"}',
            "--loop-cpu",
            "500m",
            "--loop-memory",
            "1Gi",
        ]
    )
    assert s.loop is not None
    assert s.loop.node_selector == {"pool": "ml"}
    assert s.loop.tolerations == ({"key": "k", "operator": "Exists", "effect": "NoSchedule"},)
    assert (s.loop.cpu, s.loop.memory) == ("500m", "1Gi")
    for bad in ("not json", '["a"]', '{"kee": "k"}', "{}"):
        with pytest.raises(SystemExit) as exc:
            _parse([*base, "--loop-pvc", "p", "--loop-toleration", bad])
        assert exc.value.code == 2
    with pytest.raises(SystemExit):
        _parse([*base, "--loop-pvc", "p", "--loop-node-selector", "nokey"])


def test_loop_lease_flags() -> None:
    base = ["--store", "postgresql://db/x", "--insecure-http"]
    loop = ["--loop-namespace", "d", "--loop-image", "i", "--loop-pvc", "p"]
    s = _parse([*base, *loop, "--loop-lease", "learning", "--loop-identity", "ingest-0"])
    assert (s.loop_lease, s.loop_identity) == ("learning", "ingest-0")
    assert _parse([*base, *loop]).loop_lease == ""
    with pytest.raises(SystemExit):
        _parse([*base, "--loop-lease", "learning"])  # a Lease but no loop to elect


def test_only_the_lease_holder_runs_the_loop_and_retention(tmp_path: Path) -> None:
    """Two replicas on one store, one Lease: the loop and the retention pass run in the
    holder only; when it stops (and releases the Lease), the other one takes both over."""

    class NoAuth:
        async def review(self, token: str, audience: str) -> None:
            return None

        async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> None:
            return None

    class CountingLoop:
        def __init__(self) -> None:
            self.ticks = 0

        def tick(self) -> TickReport:
            self.ticks += 1
            return TickReport()

    leases = MemoryAPI()
    args = ["--store", str(tmp_path / "s.db"), "--insecure-http", "--port", "0"]
    settings = _parse([*args, "--host", "127.0.0.1", "--retention-max-rows", "1000"])
    settings = dataclasses.replace(settings, loop_interval_s=0.01, retention_interval_s=0.01)

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        svcs, loops, retained = [], [], []
        for name in ("ingest-0", "ingest-1"):
            svc = IngestService(settings, reviewer=NoAuth(), resolver=NoAuth())
            loops.append(CountingLoop())
            svc.learning = loops[-1]  # type: ignore[assignment]
            svc.elector = LeaderElector(leases, "d", "learning", name, duration_s=0.5)
            passes = [0]

            def count(p: list[int] = passes) -> None:
                p[0] += 1

            svc.apply_retention = count  # type: ignore[method-assign]
            retained.append(passes)
            svcs.append(svc)
        await svcs[0].start()
        await asyncio.sleep(0.3)
        await svcs[1].start()
        await asyncio.sleep(0.5)
        first = [lp.ticks for lp in loops]
        passes_first = [p[0] for p in retained]
        await svcs[0].stop()
        await asyncio.sleep(0.5)
        await svcs[1].stop()
        return first, passes_first, [lp.ticks for lp in loops]

    first, passes_first, last = asyncio.run(scenario())
    assert first[0] > 0
    assert first[1] == 0
    assert passes_first[0] > 0
    assert passes_first[1] == 0
    assert last[1] > 0  # took over after the holder stopped


def test_the_retention_pass_rolls_up_what_the_last_model_trained_on(tmp_path: Path) -> None:
    """Two pods' rows of one cell and hour, a day old: folded into one once a registered
    model's experience cursor covers them; rows after the cursor stay as sent."""

    class NoAuth:
        async def review(self, token: str, audience: str) -> None:
            return None

        async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> None:
            return None

    s = _parse(["--store", str(tmp_path / "r.db"), "--insecure-http", "--rollup-after-hours", "1"])
    assert s.rollup_after_s == 3600.0
    with pytest.raises(SystemExit):
        _parse(["--store", "x.db", "--insecure-http", "--rollup-after-hours", "0"])
    svc = IngestService(s, reviewer=NoAuth(), resolver=NoAuth())
    day_ago = time.time() - 86_400
    svc.store._clock = lambda: day_ago
    try:
        for seq, pod in enumerate(("a", "b", "c")):
            b = make(seq)
            svc.store.insert_batch(
                b.model_copy(update={"pod": b.pod.model_copy(update={"uid": pod})})
            )
        svc.apply_retention()  # no model trained on anything yet: nothing folds
        assert svc.store.count_experience() == 3
        ids = [r.id for r in svc.store.experience_since(0)]
        svc.registry.register("v1", sha256="0" * 64, uri="file:///m", experience_cursor=ids[1])
        svc.apply_retention()
        rows = svc.store.experience_since(0)
        assert [(r.id, r.record.count) for r in rows] == [(ids[0], 2), (ids[2], 1)]
        assert svc.store.stored_calls() == 3
    finally:
        svc.store.close()

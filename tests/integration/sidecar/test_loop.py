"""The learning loop with real processes: 8 ranks + 8 sidecars + the operator's ingest.

- 8 rank processes load the real plugin (.so) through the harness and play one
  world communicator (8 ranks, one GPU per pod), timed by the simulator for
  the configuration the plugin chose (tests/integration/sidecar/loop_procs.py);
- 8 sidecar processes (`dynamiccl sidecar`), one per pod, agree on tables
  through the epoch record on the REAL kube-apiserver (`--coordination kube`),
  aggregate the profiler rings and send rewards over HTTPS with audience-bound
  ServiceAccount tokens minted by TokenRequest for the pods of a real Job
  (rotated mid-run);
- the operator's ingest process (TokenReview on the same API server, SQLite,
  then a real PostgreSQL server) stores them and its learning loop writes the
  job's TuningRun status.

Mid-run one sidecar is killed with SIGKILL and restarted. At the end: every
rank made the same decision at every call; at least two tables were committed
and used; every measured call is stored exactly once (sent = stored = played
minus what the plugin dropped on full rings); the TuningRun status counts them.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py. The
processes, config dir and tokens: loop_cluster.py.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl.api.epoch import EpochStatus
from dynamiccl.sidecar.cas import load_record
from dynamiccl.sidecar.config import JobInfo
from dynamiccl.sidecar.kube_cas import kube_backends
from dynamiccl.sidecar.ring import RingReader
from dynamiccl.testing import postgres as pg_server
from tests.integration.sidecar.loop_cluster import (
    NODE,
    PODS,
    Ingest,
    Job,
    Sidecar,
    mint,
    name_uid,
    write_config,
)

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CALLS = int(os.environ.get("DYNAMICCL_LOOP_CALLS", "8000"))
PACE_S = 0.06  # per 10 calls: at most ~160 collectives/s per rank


@pytest.fixture(scope="module")
def api(admin_api: k8s.ApiClient) -> k8s.ApiClient:
    """The admin client, once the TuningRun CRD is established."""
    ext = k8s.ApiextensionsV1Api(admin_api)
    doc = yaml.safe_load((ROOT / "crds" / "dynamiccl.io_tuningruns.yaml").read_text())
    try:  # installed once per cluster; never deleted here (shared cluster)
        ext.create_custom_resource_definition(doc)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
        assert crd.status is not None
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            break
        time.sleep(0.2)
    return admin_api


@pytest.fixture
def job(api: k8s.ApiClient) -> Iterator[Job]:
    core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
    ns = f"agent-loop-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    core.create_namespaced_service_account(ns, {"metadata": {"name": "trainer"}})  # type: ignore[arg-type]  # the client takes dict bodies
    try:
        obj = batch.create_namespaced_job(
            ns,
            {  # type: ignore[arg-type]  # the client takes dict bodies
                "metadata": {"name": "llm"},
                "spec": {
                    "parallelism": PODS,
                    "completions": PODS,
                    "template": {
                        "spec": {
                            "serviceAccountName": "trainer",
                            "automountServiceAccountToken": False,
                            "restartPolicy": "Never",
                            "containers": [{"name": "train", "image": "example.invalid/t:1"}],
                        }
                    },
                },
            },
        )
        deadline = time.monotonic() + 60
        pods: list[Any] = []
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(ns, label_selector="job-name=llm").items
            if len(pods) >= PODS:
                break
            time.sleep(0.3)
        assert len(pods) >= PODS, "the Job controller did not create the pods"
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(
            "dynamiccl.io",
            "v1alpha1",
            ns,
            "tuningruns",
            {
                "apiVersion": "dynamiccl.io/v1alpha1",
                "kind": "TuningRun",
                "metadata": {"name": "llm-dynamiccl"},
                "spec": {
                    "jobRef": {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "llm",
                        "uid": name_uid(obj)[1],
                    },
                    # what the ingest checks: the job is tuned, with this model
                    "mode": "learned",
                    "modelVersion": "default",
                    "configMapName": "llm-dynamiccl",
                },
            },
        )
        yield Job(ns, "llm", name_uid(obj)[1], [name_uid(p) for p in pods[:PODS]])
    finally:
        core.delete_namespace(ns, propagation_policy="Background")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'experience.db'}"
        return
    if not pg_server.available():
        pytest.fail("PostgreSQL binaries missing: apt-get install postgresql-15 (or set PG_BIN)")
    with pg_server.PgServer() as pg:
        yield pg.url


def test_eight_ranks_eight_sidecars_every_reward_lands_once(
    api: k8s.ApiClient, cluster_kubeconfig: Path, job: Job, store_url: str, tmp_path: Path
) -> None:
    ingest = Ingest(store_url, job.namespace, tmp_path / "tls", cluster_kubeconfig)
    cfg = tmp_path / "config"
    write_config(cfg, job)
    sidecars: list[Sidecar] = []
    ranks: list[subprocess.Popen[str]] = []
    out = tmp_path / "out"
    out.mkdir()
    try:
        for i, pod in enumerate(job.pods):
            pod_dir = tmp_path / f"pod-{i}"
            pod_dir.mkdir()
            (pod_dir / "token").write_text(mint(api, job, pod))
            args = [
                sys.executable, "-m", "dynamiccl.cli", "sidecar", "--json",
                "--config-dir", str(cfg), "--shm", str(pod_dir / "dynamiccl.shm"),
                "--pod-name", pod[0], "--pod-uid", pod[1],
                "--ingest-url", ingest.url, "--token-file", str(pod_dir / "token"),
                "--ca-file", str(ingest.crt), "--coordination", "kube",
                "--kubeconfig", str(cluster_kubeconfig), "--step-interval", "1",
                "--flush-interval", "1", "--min-proposal-interval", "8",
            ]  # fmt: skip
            sc = Sidecar(i, args, tmp_path / f"sidecar-{i}.log")
            sc.launch()
            sidecars.append(sc)
        for sc in sidecars:
            sc.started()
        topo = {**NODE, "container_gpus": 1}
        for i in range(PODS):
            a = {
                "shm": str(tmp_path / f"pod-{i}" / "dynamiccl.shm"),
                "rank": i,
                "n": CALLS,
                "seed": 7,
                "pace": PACE_S,
                "out": str(out),
                "topology": topo,
            }
            ranks.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "loop_procs.py"), json.dumps(a)],
                    stderr=(tmp_path / f"rank-{i}.log").open("w"),
                    text=True,
                )
            )
        # one third in: the kubelet rotates every projected token
        _wait_calls(sidecars[0], CALLS // 3, ranks)
        for i, pod in enumerate(job.pods):
            (tmp_path / f"pod-{i}" / "token").write_text(mint(api, job, pod))
        # a little later: one sidecar is killed -9 with rewards in flight, and restarted
        _wait_calls(sidecars[3], CALLS // 2, ranks)
        mid_metrics = sidecars[3].metrics()
        sidecars[3].kill9()
        time.sleep(0.5)
        sidecars[3].start()
        for r in ranks:
            assert r.wait(900) == 0, "a rank failed (see its log)"
        summaries = [sc.stop() for sc in sidecars]
        stored_calls, stored_batches = ingest.stored(job.uid)
        status_calls = _wait_status(api, job, stored_calls)  # the loop runs in the ingest process
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
        for sc in sidecars:
            if sc.proc is not None and sc.proc.poll() is None:
                sc.proc.kill()
        ingest_err = ""
        ingest.stop()
        if ingest.proc.stderr is not None:
            ingest_err = ingest.proc.stderr.read()[-3000:]

    # 1. every rank of the communicator made the same decision at every call
    logs = {(out / f"decisions-{i}.bin").read_bytes() for i in range(PODS)}
    assert len(logs) == 1, "ranks diverged"
    (decisions,) = logs
    assert len(decisions) == 3 * CALLS
    stats = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(PODS)]
    played = sum(s["played"] for s in stats)

    # 2. tables were agreed through the record on the API server and used
    record_store, _, tables = kube_backends(
        JobInfo(
            namespace=job.namespace, name=job.name, kind="Job", api_version="batch/v1", uid=job.uid
        ),
        cluster_kubeconfig,
    )
    rec, _ = load_record(record_store)
    assert rec is not None
    committed = [e for e in rec.epochs if e.status == EpochStatus.COMMITTED]
    assert len(committed) >= 2, rec
    assert committed[0].boundary < CALLS
    assert sorted(rec.voters) == sorted(p for p, _ in job.pods)
    first_k = committed[0].boundary
    nccl = {decisions[3 * i : 3 * i + 3] for i in range(first_k)}
    tuned = {decisions[3 * i : 3 * i + 3] for i in range(first_k, CALLS)}
    assert tuned - nccl, "no configuration beyond NCCL's own was ever used"

    # 3. every measured call stored exactly once: sent = stored = played - dropped, where
    # dropped = records the plugin could not queue because the ring (1024 records) was full
    drops = []
    for i in range(PODS):
        reader = RingReader(tmp_path / f"pod-{i}" / "dynamiccl.shm")
        try:
            drops.append(sum(reader.dropped(s) for s in reader.used_slots()))
        finally:
            reader.close()
    dropped = sum(drops)
    sent_calls = sum(s["acknowledged_calls"] for s in summaries)
    sent_batches = sum(s["acknowledged_batches"] for s in summaries)
    assert all(s["outbox_batches"] == 0 for s in summaries), (summaries, ingest_err)
    assert sent_calls == stored_calls, (sent_calls, stored_calls)
    assert sent_batches == stored_batches
    assert stored_calls == played - dropped, (played, dropped, stored_calls)
    # the rings kept up, except possibly on the pod whose sidecar was down for a few seconds
    assert [d for i, d in enumerate(drops) if i != 3] == [0] * (PODS - 1), drops
    assert sidecars[3].starts == 2
    assert summaries[3]["acknowledged_calls"] > 0
    assert "dynamiccl_sidecar_ring_records_total" in mid_metrics

    # 4. the job's TuningRun status counts them (the learning loop of the ingest process)
    assert status_calls == stored_calls
    assert tables.get(committed[-1].table_version) is not None


def _wait_status(api: k8s.ApiClient, job: Job, calls: int) -> int | None:
    custom = k8s.CustomObjectsApi(api)
    deadline, got = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        tr = cast(  # the custom-objects API returns the object's JSON
            dict[str, Any],
            custom.get_namespaced_custom_object(
                "dynamiccl.io", "v1alpha1", job.namespace, "tuningruns", "llm-dynamiccl"
            ),
        )
        got = ((tr.get("status") or {}).get("reward") or {}).get("calls")
        if got == calls:
            break
        time.sleep(1)
    return got


def _wait_calls(sc: Sidecar, calls: int, ranks: list[subprocess.Popen[str]]) -> None:
    """Until the sidecar read `calls` records (or the ranks finished)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if all(r.poll() is not None for r in ranks):
            return
        try:
            text = sc.metrics()
        except (OSError, http.client.HTTPException, ssl.SSLError):
            text = ""
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "dynamiccl_sidecar_ring_records_total" and float(value) >= calls:
                return
        time.sleep(0.5)

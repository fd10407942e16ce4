"""Epoch agreement at scale (issue 33 item 2): commit time and apiserver writes per epoch
against the job's pods, the single-record protocol (before) against ballots (now), in one run.

Run it against a PRIVATE control plane (it creates thousands of ConfigMap writes):

    export DYNAMICCL_PORT_BASE=47000 DYNAMICCL_CLUSTER_DIR=/tmp/h4-agree
    bash hack/cluster-up.sh --no-build
    .venv/bin/python benchmarks/agreement_scale_bench.py --kubeconfig /tmp/h4-agree/kubeconfig
    bash hack/cluster-down.sh --wipe

Per size and protocol, in a fresh namespace: one job's coordination ConfigMaps on the real
apiserver (created by the first write: the bench's admin may create), an epoch record
listing every pod, one table. Every pod's sidecar part is the PRODUCT's code: now
`dynamiccl.sidecar.participant.Participant` (ballots, `KubeKeys`) and the proposer
`dynamiccl.sidecar.proposer.Coordinator`; before, the same two modules as of commit
BEFORE, loaded from git (each pod votes by compare-and-swap on the one record). The pods
step in rounds, as their sidecars do every 0.5 s, through a pool of `--threads` client
threads; the proposer steps after each round. The one stand-in is each pod's
shared-memory file with its processes (`PodFile`): one process, registered, alive, at
the first boundary (below every proposed K), so every pod votes yes.

Measured per epoch (from the proposal to every pod's file saying COMMITTED): wall time,
rounds, and the apiserver's own count of ConfigMap writes (``apiserver_request_total``,
verbs POST/PUT/PATCH, by code: 409 is a refused compare-and-swap), plus the epoch
record's size. On this 2-core machine the wall time is that of simulating every pod's
client in one Python process against one apiserver; the rounds and the writes are what a
real job of that size would do. A size the old protocol does not commit within
`--epoch-timeout` is reported with the votes it collected by then.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import time
import types
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dynamiccl.api import sidecar_objects
from dynamiccl.api.epoch import EpochStatus
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar import shm
from dynamiccl.sidecar.cas import load_record
from dynamiccl.sidecar.config import JobInfo
from dynamiccl.sidecar.kube_cas import KubeCAS, KubeTableStore, ballot_box
from dynamiccl.sidecar.participant import Participant
from dynamiccl.sidecar.proposer import Coordinator, init_record

REPO = Path(__file__).resolve().parents[1]
BEFORE = "1c571d1"  # the last commit of the single-record protocol
L = 64
WRITES = ("POST", "PUT", "PATCH")


class PodFile:
    """THE stand-in: a pod's shared-memory file and its one training process, registered,
    alive, at the first boundary. Only the calls `Participant` makes."""

    def __init__(self, procs: int = 1) -> None:
        self.interval = L
        self.n = procs  # 0: the pod's process is missing (not started, or gone)
        self._slots: dict[int, tuple[int, int, int]] = {}
        self._images: dict[int, tuple[int, int, int, int]] = {}

    def slot(self, epoch: int) -> tuple[int, int, int]:
        return self._slots.get(shm.slot_of(epoch), (0, shm.EPOCH_NONE, 0))

    def take_slot(self, epoch: int, status: int, boundary: int) -> None:
        self._slots[shm.slot_of(epoch)] = (epoch, status, boundary)

    def set_entry(self, epoch: int, status: int, boundary: int) -> None:
        self._slots[shm.slot_of(epoch)] = (epoch, status, boundary)

    def image_header(self, epoch: int) -> tuple[int, int, int, int]:
        return self._images.get(shm.slot_of(epoch), (0, 0, 0, 0))

    def put_image(self, epoch: int, image: bytes) -> None:
        held, version, digest = struct.unpack_from("<I4xQQ", image, 16)
        assert held == epoch
        self._images[shm.slot_of(epoch)] = (2, held, version, digest)  # TABLE_READY

    def procs(self) -> list[shm.ProcSlot]:
        return [shm.ProcSlot(index=0, pid=1, max_boundary=L, generation=1, needs=(1,))][: self.n]

    def committed(self, epoch: int) -> bool:
        return self.slot(epoch)[:2] == (epoch, shm.EPOCH_COMMITTED)


def old_module(path: str, name: str) -> types.ModuleType:
    """`path` of the agent as of BEFORE, as a module (the product's code of then)."""
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BEFORE}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(compile(src, f"{BEFORE}:{path}", "exec"), mod.__dict__)
    return mod


def writes(api: k8s.ApiClient) -> Counter[tuple[str, str]]:
    """The apiserver's ConfigMap writes so far, by (verb, code)."""
    host = api.configuration.host
    rest: Any = api.rest_client  # kubernetes.client.rest is unannotated
    resp = rest.request("GET", f"{host}/metrics")
    resp.read()
    out: Counter[tuple[str, str]] = Counter()
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{") or 'resource="configmaps"' not in line:
            continue
        labels = dict(
            kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        verb, code = labels["verb"].strip('"'), labels["code"].strip('"')
        if verb in WRITES:
            out[verb, code] += int(float(line.rsplit(" ", 1)[1]))
    return out


def run_epoch(  # noqa: PLR0917
    api: k8s.ApiClient,
    pods: int,
    proto: str,
    threads: int = 32,
    timeout_s: float = 300.0,
    missing: int | None = None,
) -> dict[str, Any]:
    """One epoch of a job of `pods` pods under `proto` ("before" or "now") in a namespace of
    its own (`missing`: the pod whose process is missing)."""
    core: Any = k8s.CoreV1Api(api)
    ns = f"agree-{proto}-{pods}-{uuid.uuid4().hex[:4]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        return _epoch(SimJob(api, ns, pods, proto, missing), threads, timeout_s)
    finally:
        core.delete_namespace(ns)


class SimJob:
    """One job's pods (the product's participants on `PodFile`s) and its proposer."""

    def __init__(
        self, api: k8s.ApiClient, ns: str, pods: int, proto: str, missing: int | None
    ) -> None:
        job = JobInfo(namespace=ns, name="llm", kind="PyTorchJob", uid=str(uuid.uuid4()))
        names = tuple(f"llm-worker-{i}" for i in range(pods))
        self.api, self.pods, self.proto = api, pods, proto
        self.record = KubeCAS(api, job, sidecar_objects.epochs_name(job.name), "epoch-record")
        tables = KubeTableStore(api, job)
        init_record(self.record, L, names)
        self.files = [PodFile(0 if i == missing else 1) for i in range(pods)]
        pairs = zip([cast("shm.ShmFile", f) for f in self.files], names, strict=True)
        if proto == "now":
            box = ballot_box(api, job, pods)
            self.parts: list[Any] = [
                Participant(self.record, tables, f, n, 1, abort_after_s=1e9, ballots=box)
                for f, n in pairs
            ]
            self.leader: Any = Coordinator(self.record, tables, lead=4, ballots=box)
        else:
            old_p = old_module("sidecar/participant.py", "before_participant")
            old_c = old_module("sidecar/proposer.py", "before_coordinator")
            self.parts = [old_p.Participant(self.record, tables, f, n, 1, 1e9) for f, n in pairs]
            self.leader = old_c.Coordinator(self.record, tables, lead=4)
        self.failures: Counter[str] = Counter()

    def _one(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a sidecar's step that failed: it tries again next step
            self.failures[type(exc).__name__] += 1

    def round(self, pool: ThreadPoolExecutor) -> None:
        """Every pod's sidecar steps once, then the proposer."""
        list(pool.map(self._one, [p.step for p in self.parts]))
        self._one(self.leader.step)

    def status(self) -> EpochStatus:
        rec, _ = load_record(self.record)
        assert rec is not None
        return rec.epochs[-1].status

    def done(self) -> bool:
        return all(f.committed(1) for f in self.files)

    def votes(self) -> int:
        if self.proto == "before":
            rec, _ = load_record(self.record)
            assert rec is not None
            return len(rec.epochs[-1].votes)
        return sum(1 for p in self.parts if p.ballot.vote is not None)


def _epoch(sim: SimJob, threads: int, timeout_s: float) -> dict[str, Any]:
    pool = ThreadPoolExecutor(threads)
    sim.round(pool)  # every pod reports once (its ballot, or the record): the steady state
    before = writes(sim.api)
    t0 = time.monotonic()
    assert sim.leader.publish(DecisionTable(version=1, scales=(), cells=())) == 1
    rounds, committed_at, status = 0, None, EpochStatus.PENDING
    while time.monotonic() - t0 < timeout_s:
        sim.round(pool)
        rounds += 1
        status = sim.status()
        if status != EpochStatus.PENDING and committed_at is None:
            committed_at = time.monotonic() - t0
        if status == EpochStatus.ABORTED or sim.done():
            break
    wall = time.monotonic() - t0
    delta = writes(sim.api) - before
    pool.shutdown()
    raw, _v = sim.record.read()
    return {
        "pods": sim.pods,
        "protocol": sim.proto,
        "status": str(status),
        "decided_s": None if committed_at is None else round(committed_at, 2),
        "all_files_committed_s": round(wall, 2) if sim.done() else None,
        "rounds": rounds,
        "writes": sum(delta.values()),
        "writes_ok": sum(n for (_verb, code), n in delta.items() if code.startswith("2")),
        "conflicts_409": sum(n for (_verb, code), n in delta.items() if code == "409"),
        "record_bytes": len(raw or ""),
        "votes_in": sim.votes(),
        "step_failures": dict(sim.failures),
        "ballot_objects": sidecar_objects.vote_groups(sim.pods) if sim.proto == "now" else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--pods", default="16,128,1024,2000")
    ap.add_argument("--protocols", default="before,now")
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--epoch-timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    urllib3.disable_warnings()
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(str(args.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
    cfg.connection_pool_maxsize = args.threads + 4
    api = k8s.ApiClient(cfg)
    rows = []
    for pods in (int(p) for p in args.pods.split(",")):
        for proto in args.protocols.split(","):
            row = run_epoch(api, pods, proto, args.threads, args.epoch_timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

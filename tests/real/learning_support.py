"""Pieces of the learning check on the real node (tests/real/test_learning_real.py).

* `ServiceClient`: the sidecar's own HTTPS client (sidecar/sender.py `Client`),
  dialling the ingest Service's ClusterIP from this machine (kube-proxy's
  iptables rules route it to the ingest pod on the real node) and verifying the
  server certificate for the Service's DNS name, the name a sidecar dials.
* `bound_token`: a ServiceAccount token bound to a pod with the ingest's
  audience, what the kubelet projects into a tuned pod for its sidecar.
* `Recorder`: `harness_job.play_job`'s client (the sidecar sends through it): each batch
  through a `ServiceClient` and keeps what was sent.
* `slower_cells`: where the rewards showed NCCL's pick slower than a measured
  alternative; `first_choices`: a table's first choice per cell.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import Origin, RewardBatch
from dynamiccl.api.table import DecisionTable, scale_class
from dynamiccl.sidecar.sender import Answer, Client

# a cell is slower under NCCL's pick when an alternative's mean beat NCCL's default time
# by this factor in the job's measurements (the threshold of the learning-effect tests,
# tests/unit/demo/test_learning_sequence.py; the surface's departure is 1.25x vs Ring with
# the same protocol, ~1.08x vs NCCL's pick at 128 MiB)
SLOWER_BY: Final = 1.05
# a measured configuration within this of NCCL's default time is no faster (the surface's
# jitter is 3 % per call; a cell's mean is over hundreds of calls)
NOISE: Final = 0.01
Cell = tuple[Collective, int, int]  # (collective, size bucket, scale class)
Config = tuple[Algo, Proto, int, int]  # (algorithm, protocol, channels, chunk bytes)


@dataclass(frozen=True)
class IngestService:
    """The release's ingest as this machine reaches it."""

    cluster_ip: str
    port: int
    server_name: str  # <service>.<namespace>.svc: the certificate's name
    ca_file: Path


def ingest_service(core: Any, namespace: str, release: str, ca_file: Path) -> IngestService:
    """The ingest Service of `release` and the CA its certificate chains to (the TLS Secret's)."""
    svc = core.read_namespaced_service(f"{release}-ingest", namespace)
    secret = core.read_namespaced_secret(f"{release}-webhook-tls", namespace)
    ca_file.write_bytes(base64.b64decode(secret.data["ca.crt"]))
    return IngestService(
        cluster_ip=svc.spec.cluster_ip,
        port=int(svc.spec.ports[0].port),
        server_name=f"{release}-ingest.{namespace}.svc",
        ca_file=ca_file,
    )


class _ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to an IP address, verifying the certificate for another name (SNI too)."""

    def __init__(self, ip: str, port: int, server_name: str, ctx: ssl.SSLContext, timeout: float):
        super().__init__(ip, port, timeout=timeout, context=ctx)
        self._server_name = server_name
        self._ctx = ctx

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)


class ServiceClient(Client):
    """The sidecar's `Client` through the Service's ClusterIP (see the module docstring)."""

    def __init__(self, ingest: IngestService, token_file: Path) -> None:
        url = f"https://{ingest.cluster_ip}:{ingest.port}/v1/rewards"
        super().__init__(url, token_file, ingest.ca_file, timeout_s=30.0)
        self._server_name = ingest.server_name

    def _connect(self) -> http.client.HTTPConnection:
        if self._conn is None:
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            self._conn = _ServiceConnection(
                self.host, self.port, self._server_name, ctx, self.timeout_s
            )
        return self._conn


def bound_token(core: Any, namespace: str, pod: Any) -> str:
    """A token of the pod's ServiceAccount, bound to the pod, for the ingest's audience."""
    body = {
        "spec": {
            "audiences": [c.INGEST_AUDIENCE],
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        }
    }
    sa = pod.spec.service_account_name or "default"
    answer = core.create_namespaced_service_account_token(sa, namespace, body)
    return str(answer.status.token)


@dataclass
class Recorder:
    """`play_job`'s client: each batch the sidecar sends goes through `client`; what was
    accepted is kept."""

    client: Client
    batches: list[RewardBatch] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    def post(self, body: bytes) -> Answer:
        answer = self.client.post(body)
        self.answers.append(f"{answer.status} {answer.detail}".strip())
        if answer.ok:
            self.batches.append(RewardBatch.model_validate_json(body))
        return answer


def slower_configs(batches: Iterable[RewardBatch]) -> dict[Cell, dict[Config, float]]:
    """Per cell, every measured configuration (algorithm, protocol, channels, chunk) that beat
    NCCL's own pick by `SLOWER_BY`, with its speedup over NCCL's default time."""
    calls: dict[tuple[Cell, Config], list[tuple[int, float, float]]] = defaultdict(list)
    for b in batches:
        for r in b.records:
            cell = (r.collective, r.size_bucket, scale_class(r.nranks, r.nnodes))
            config = (r.algo, r.proto, r.nchannels, r.chunk_bytes)
            calls[(cell, config)].append((r.count, r.mean_time_us, r.nccl_default_time_us))
    out: dict[Cell, dict[Config, float]] = defaultdict(dict)
    for (cell, config), rows in calls.items():
        speedup = sum(k * d for k, _, d in rows) / sum(k * t for k, t, _ in rows)
        if speedup >= SLOWER_BY:
            out[cell][config] = speedup
    return dict(out)


def slower_cells(batches: Iterable[RewardBatch]) -> dict[Cell, tuple[Algo, Proto, float]]:
    """Cells where a measured configuration beat NCCL's own pick by `SLOWER_BY`:
    the fastest such (algorithm, protocol) and its speedup over NCCL's default time."""
    best: dict[Cell, tuple[Algo, Proto, float]] = {}
    for cell, found in slower_configs(batches).items():
        (algo, proto, _, _), speedup = max(found.items(), key=lambda kv: kv[1])
        best[cell] = (algo, proto, speedup)
    return best


def confirmed_slower_cells(
    jobs: Iterable[Iterable[RewardBatch]], min_jobs: int
) -> dict[Cell, tuple[Algo, Proto, float]]:
    """Cells where at least `min_jobs` jobs each measured the same configuration (channel
    count and chunk included) faster than NCCL's pick on their own: what a retrain learns
    from (issue 29: one job's claimed gain weighs nothing, `policy/train/store_data.py`
    Weighting.min_jobs, per configuration; two jobs that committed the faster pair at other
    channel counts confirm neither). The fastest such pair, at the lowest of those jobs'
    speedups."""
    per_job = [slower_configs(batches) for batches in jobs]
    out: dict[Cell, tuple[Algo, Proto, float]] = {}
    for cell in {cell for found in per_job for cell in found}:
        configs = {config for f in per_job for config in f.get(cell, {})}
        for config in configs:
            same = [f[cell][config] for f in per_job if config in f.get(cell, {})]
            if len(same) >= min_jobs and min(same) > out.get(cell, (config[0], config[1], 0.0))[2]:
                out[cell] = (config[0], config[1], min(same))
    return out


def measured_cells(batches: Iterable[RewardBatch]) -> set[Cell]:
    """Every cell the rewards hold a measurement of."""
    return {
        (r.collective, r.size_bucket, scale_class(r.nranks, r.nnodes))
        for b in batches
        for r in b.records
    }


def nccl_fastest_cells(batches: Iterable[RewardBatch]) -> dict[Cell, float]:
    """Cells where the job explored (an `explore` record: a configuration other than the
    one it ran) and nothing measured beat NCCL's default time by more than the noise
    (`NOISE`): the comparison showed NCCL's pick the fastest. A cell where only NCCL's
    own pick ran compared nothing and is left out. The value: the best speedup measured."""
    sums: dict[tuple[Cell, Algo, Proto], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    explored: set[Cell] = set()
    for b in batches:
        for r in b.records:
            cell = (r.collective, r.size_bucket, scale_class(r.nranks, r.nnodes))
            if r.origin is Origin.EXPLORE:
                explored.add(cell)
            acc = sums[(cell, r.algo, r.proto)]
            acc[0] += r.count
            acc[1] += r.count * r.mean_time_us
            acc[2] += r.count * r.nccl_default_time_us
    best: dict[Cell, float] = {}
    for (cell, _, _), (_, mean, default) in sums.items():
        best[cell] = max(best.get(cell, 0.0), default / mean)
    return {cell: s for cell, s in best.items() if cell in explored and s <= 1.0 + NOISE}


def nccl_picks(batches: Iterable[RewardBatch]) -> dict[Cell, tuple[Algo, Proto]]:
    """What NCCL itself ran in each cell (its `default` records, the most calls): a table
    cell without choices leaves the cell to NCCL, so it decides the same as a first choice
    naming NCCL's pick."""
    counts: dict[Cell, dict[tuple[Algo, Proto], int]] = defaultdict(lambda: defaultdict(int))
    for b in batches:
        for r in b.records:
            if r.origin is Origin.DEFAULT:
                cell = (r.collective, r.size_bucket, scale_class(r.nranks, r.nnodes))
                counts[cell][(r.algo, r.proto)] += r.count
    return {cell: max(by, key=lambda k: by[k]) for cell, by in counts.items()}


def first_choices(table: DecisionTable) -> dict[Cell, tuple[Algo, Proto]]:
    """Each cell's first choice (what the plugin runs when it does not explore)."""
    return {
        (cell.collective, cell.bucket, cell.scale): (cell.choices[0].algo, cell.choices[0].proto)
        for cell in table.cells
        if cell.choices
    }


def finding_choices(run: dict[str, Any]) -> dict[Cell, tuple[Algo, Proto]]:
    """The cells a TuningRun's `spec.measuredCells` says the class's findings set, with the
    (algo, proto) each runs (policy/runtime/measured.py `describe`: "allreduce/b27/32x4:
    tree/simple 1.083x NCCL's ..."). A finding holds for its scale class only: the table's
    cells of the same bucket at other scales keep the model's choice."""
    out = {}
    for line in (run.get("spec") or {}).get("measuredCells") or []:
        cell, config = line.split(": ", 1)
        coll, bucket, shape = cell.split("/")[:3]
        nranks, nnodes = (int(x) for x in shape.split("x"))
        key = (Collective(coll), int(bucket.removeprefix("b")), scale_class(nranks, nnodes))
        algo, proto = config.split(" ", 1)[0].split("/")[:2]
        out[key] = (Algo(algo), Proto(proto))
    return out

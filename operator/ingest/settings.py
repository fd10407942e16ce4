"""What the ingest process is told at start: where to listen and store, how to authenticate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dynamiccl import constants as c
from dynamiccl.operator.ingest.ratelimit import DEFAULT_JOB, DEFAULT_POD, Limit
from dynamiccl.operator.ingest.writer import DEFAULT_MAX_GROUP
from dynamiccl.operator.learning.loop import LoopConfig

ENV_MODEL_READERS: Final = "DYNAMICCL_MODEL_READERS"


@dataclass(frozen=True)
class IngestSettings:
    """Where to listen, what to store into, how to authenticate."""

    store_url: str
    tls_cert: Path | None
    tls_key: Path | None
    host: str = "0.0.0.0"
    port: int = 8443
    kubeconfig: Path | None = None  # None: in-cluster credentials
    audience: str = c.INGEST_AUDIENCE
    max_group: int = DEFAULT_MAX_GROUP
    loop: LoopConfig | None = None  # run the learning loop here (it needs the store's volume)
    loop_interval_s: float = 30.0
    # the Lease that picks the one replica running the loop (operator/learning/leader.py);
    # "" : no election, this process runs the loop (one replica)
    loop_lease: str = ""
    loop_identity: str = ""  # this replica's name in the Lease (its pod name)
    retention_max_age_s: float | None = None  # delete experience older than this
    retention_max_rows: int | None = None  # keep at most this many experience rows
    retention_interval_s: float = 3600.0
    # fold experience older than this, already trained on, per job/cell/configuration/day
    # (operator/store/rollup.py); None: keep every row as sent
    rollup_after_s: float | None = None
    tls_reload_interval_s: float = 30.0  # how often the certificate files are re-read
    # rate limits in records/s and burst (operator/ingest/ratelimit.py); None: no limit
    rate_pod: Limit | None = DEFAULT_POD
    rate_job: Limit | None = DEFAULT_JOB
    rate_store: Limit | None = None  # records/s this replica stores in all (the store's budget)
    # who may GET /v1/models/<v>.npz: usernames (the operator's ServiceAccount)
    model_readers: tuple[str, ...] = ()

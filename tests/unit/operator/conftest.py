"""Shared fixtures for the operator's unit tests: kwok nodes (hack/nodes.yaml), jobs, pods,
and the ingest service running on a loopback port."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.operator.ingest.main import IngestService
from dynamiccl.operator.ingest.settings import IngestSettings
from dynamiccl.testing import builders, certs, scripts


@pytest.fixture(scope="session")
def kwok_nodes() -> dict[str, dict[str, Any]]:
    """The local cluster's fake GPU nodes, by name."""
    return {n["metadata"]["name"]: n for n in scripts.load("gen_nodes").expand()}


class RunningIngest:
    """The real `IngestService` (TLS, SQLite store) serving on a loopback port from its
    own thread's event loop; `reviewer` answers TokenReviews and pod owner lookups."""

    def __init__(self, tmp: Path, reviewer: Any, **settings: Any) -> None:
        self.crt, key = certs.write_self_signed(tmp / "tls")
        self.loop = asyncio.new_event_loop()
        self.svc = IngestService(
            IngestSettings(
                store_url=str(tmp / "exp.db"),
                tls_cert=self.crt,
                tls_key=key,
                host="127.0.0.1",
                port=0,
                **settings,
            ),
            reviewer=reviewer,
            resolver=reviewer,
        )
        # no caching between tests' toggles: tokens are reviewed every time
        self.svc.reviewer._ttl = 0
        self.svc.reviewer._neg_ttl = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.svc.start(), self.loop).result(30)
        self.ctx = ssl.create_default_context(cafile=str(self.crt))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.svc.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="session")
def running_ingest() -> type[RunningIngest]:
    """Start one with ``running_ingest(tmp, reviewer, **IngestSettings fields)``."""
    return RunningIngest


@pytest.fixture
def pytorchjob() -> Callable[..., dict[str, Any]]:
    def make(
        *,
        name: str = "llm",
        workers: int = 1,
        gpus: int = 8,
        annotations: dict[str, str] | None = None,
        env: list[dict[str, Any]] | None = None,
        nproc: str | None = "auto",
    ) -> dict[str, Any]:
        job = builders.pytorchjob(
            name,
            namespace="team-a",
            uid="uid-" + name,
            labels={"team": "a"},
            annotations={c.ANNOTATION_TUNE: "true", **(annotations or {})},
            workers=workers,
            pod=builders.template(
                builders.container(gpus=gpus, env=env, image="example.com/train:1"),
                labels={"app": "train"},
            ),
            nproc_per_node=nproc,
        )
        job["metadata"]["generation"] = 1
        return job

    return make


@pytest.fixture
def pods_on() -> Callable[[dict[str, Any], list[str | None]], list[dict[str, Any]]]:
    def make(job: dict[str, Any], nodes: list[str | None]) -> list[dict[str, Any]]:
        return [builders.pod_of(job, i, n) for i, n in enumerate(nodes)]

    return make

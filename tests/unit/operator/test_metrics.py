"""Metric names follow Prometheus conventions (dynamiccl_ prefix, base units, _total)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from dynamiccl.operator import metrics


def test_names_and_units() -> None:
    names = {m.name for m in REGISTRY.collect() if m.name.startswith("dynamiccl_")}
    assert "dynamiccl_webhook_requests" in names  # counters are exposed with _total samples
    for m in REGISTRY.collect():
        if m.name.startswith("dynamiccl_") and m.type == "histogram":
            assert m.name.endswith("_seconds")
    before = metrics.WEBHOOK_REQUESTS.labels(result="mutated")._value.get()
    metrics.WEBHOOK_REQUESTS.labels(result="mutated").inc()
    assert metrics.WEBHOOK_REQUESTS.labels(result="mutated")._value.get() == before + 1

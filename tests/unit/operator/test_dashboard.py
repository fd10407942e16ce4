"""The chart's Grafana dashboard plots only metrics the components export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

from dynamiccl.operator import metrics as operator_metrics
from dynamiccl.operator.ingest.app import IngestMetrics
from dynamiccl.operator.learning.metrics import LoopMetrics
from dynamiccl.sidecar.metrics import AgentMetrics

DASHBOARD = Path(__file__).resolve().parents[3] / "charts/dynamiccl/dashboards/dynamiccl.json"


def _exported() -> set[str]:
    ingest = IngestMetrics()
    LoopMetrics(ingest.registry)
    registries: list[CollectorRegistry] = [REGISTRY, ingest.registry, AgentMetrics().registry]
    assert operator_metrics.RECONCILES is not None  # the operator's, in the default registry
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        fam.name + suffix
        for r in registries
        for fam in r.collect()
        for suffix in suffixes.get(fam.type, ("",))
    }


def test_every_series_the_dashboard_plots_is_exported() -> None:
    exported = _exported()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    used = {
        name
        for p in panels
        for t in p["targets"]
        for name in re.findall(r"dynamiccl_[a-z0-9_]+", t["expr"])
    }
    assert len(used) >= 10
    assert used - exported == set()
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles))

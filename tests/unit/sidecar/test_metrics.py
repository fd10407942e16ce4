"""The sidecar's Prometheus endpoint."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from dynamiccl.sidecar.metrics import AgentMetrics


def test_metrics_are_served_prefixed_with_total_counters_and_base_units() -> None:
    m = AgentMetrics()
    m.records_read.inc(5)
    m.calls.labels(origin="explore").inc(2)
    m.send_duration.observe(0.01)
    m.leader.set(1)
    port = m.serve(0, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("dynamiccl_sidecar_") for name in fams)
    samples = {s.name: s for f in fams.values() for s in f.samples}
    assert samples["dynamiccl_sidecar_ring_records_total"].value == 5
    assert samples["dynamiccl_sidecar_leader"].value == 1
    explore = [
        s for s in fams["dynamiccl_sidecar_collective_calls"].samples if s.name.endswith("_total")
    ]
    assert [(s.labels, s.value) for s in explore] == [({"origin": "explore"}, 2.0)]
    assert "dynamiccl_sidecar_ingest_request_duration_seconds_bucket" in samples
    for f in fams.values():
        if f.type == "counter":
            assert any(s.name == f.name + "_total" for s in f.samples) or not f.samples


def test_two_sidecars_in_one_process_do_not_share_metrics() -> None:
    a, b = AgentMetrics(), AgentMetrics()
    a.records_read.inc()
    assert b.records_read._value.get() == 0

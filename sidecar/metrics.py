"""Prometheus metrics of the sidecar (``dynamiccl_sidecar_*``, base units, ``_total`` counters).

One registry per `AgentMetrics` (tests run several sidecars in one process);
`serve(port)` exposes it on ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_P = "dynamiccl_sidecar_"


class AgentMetrics:
    """Every metric the sidecar exports."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.records_read = Counter(
            _P + "ring_records", "Profiler records read from the rings", registry=r
        )
        self.records_dropped = Counter(
            _P + "ring_dropped_records",
            "Records the plugin dropped because a ring was full (from the rings' counters)",
            registry=r,
        )
        self.records_skipped = Counter(
            _P + "skipped_records",
            "Records read but not aggregated",
            ["reason"],
            registry=r,
        )
        self.calls = Counter(
            _P + "collective_calls", "Measured collectives aggregated", ["origin"], registry=r
        )
        self.batches_cut = Counter(_P + "batches_cut", "Reward batches written", registry=r)
        self.requests = Counter(
            _P + "ingest_requests", "Requests to the ingest endpoint", ["code"], registry=r
        )
        self.batches_acked = Counter(
            _P + "batches_acked",
            "Batches the endpoint acknowledged (duplicate: stored by an earlier attempt)",
            ["duplicate"],
            registry=r,
        )
        self.batches_rejected = Counter(
            _P + "batches_rejected", "Batches refused for good", ["code"], registry=r
        )
        self.acked_calls = Gauge(
            _P + "acknowledged_calls",
            "Collective calls in acknowledged batches (all of this pod's life)",
            registry=r,
        )
        self.acked_batches = Gauge(
            _P + "acknowledged_batches", "Acknowledged batches (all of this pod's life)", registry=r
        )
        self.outbox = Gauge(_P + "outbox_batches", "Batches waiting to be sent", registry=r)
        self.open_keys = Gauge(
            _P + "open_aggregates", "Aggregates not cut into a batch yet", registry=r
        )
        self.send_duration = Histogram(
            _P + "ingest_request_duration_seconds", "Ingest request latency", registry=r
        )
        self.drain_duration = Histogram(
            _P + "drain_duration_seconds",
            "One pass over the rings (read, aggregate, persist)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.leader = Gauge(_P + "leader", "1 if this sidecar proposes tables", registry=r)
        self.epochs_proposed = Counter(
            _P + "epochs_proposed", "Epochs this sidecar proposed", registry=r
        )
        self.table_version = Gauge(
            _P + "table_version", "Version of the latest committed table (0: none)", registry=r
        )
        self.committed_epochs = Gauge(
            _P + "committed_epochs", "Committed epochs of the job", registry=r
        )
        self.tuner_events = Counter(
            _P + "tuner_events", "Online-tuner events", ["kind"], registry=r
        )
        self.coordination_errors = Counter(
            _P + "coordination_errors",
            "Failed steps of the epoch protocol (the plugin keeps its table)",
            registry=r,
        )
        self.config_ok = Gauge(
            _P + "config_valid", "1 when the job's configuration is usable", registry=r
        )
        self.unmeasured_processes = Gauge(
            _P + "unmeasured_processes",
            "Training processes whose NCCL loaded the tuner but no profiler (tuned, not measured)",
            registry=r,
        )
        self.online_shapes = Gauge(
            _P + "online_shapes",
            "Communicator shapes no compiled table covers: tuned online, or untuned (no room)",
            ["state"],
            registry=r,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on `port` (0: an ephemeral port); returns the port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_address[1])

"""Prometheus metrics of the operator (``dynamiccl_*``, base units, ``_total`` counters)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WEBHOOK_REQUESTS = Counter(
    "dynamiccl_webhook_requests_total",
    "Admission requests answered, by result "
    "(mutated, untuned, skipped, no-job, stale-config, miss-timeout, error).",
    ["result"],
)
WEBHOOK_SECONDS = Histogram(
    "dynamiccl_webhook_duration_seconds",
    "Time to answer one admission request.",
    buckets=(
        0.0001,
        0.00025,
        0.0005,
        0.001,
        0.002,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
    ),
)
WEBHOOK_HANDSHAKES = Counter(
    "dynamiccl_webhook_tls_handshakes_total",
    "TLS handshakes on the webhook port (one per new connection; the apiserver reuses them).",
)
RECONCILES = Counter(
    "dynamiccl_reconciles_total",
    "Job events handled, by kind and outcome "
    "(tuned untuned ignored unchanged deleting finished error).",
    ["kind", "outcome"],
)
RECONCILE_SECONDS = Histogram(
    "dynamiccl_reconcile_duration_seconds",
    "Time to build a job's features and write its ConfigMap and TuningRun.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
TUNED_JOBS = Gauge("dynamiccl_tuned_jobs", "Jobs with a ConfigMap (tuned) known to this replica.")
CERT_ROTATIONS = Counter(
    "dynamiccl_webhook_certificate_rotations_total", "Self-managed webhook certificates issued."
)

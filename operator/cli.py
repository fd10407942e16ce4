"""`dynamiccl operator` and `dynamiccl inject` (operator issue #4)."""

from __future__ import annotations

from dynamiccl._stub import not_implemented


def inject() -> None:
    """Print a manifest mutated exactly as the admission webhook would."""
    not_implemented("inject", 4)


def operator() -> None:
    """Run the operator (kopf handlers, webhook, reward ingest)."""
    not_implemented("operator", 4)

"""`dynamiccl demo`: the whole loop on the embedded default (issue #8)."""

from __future__ import annotations

from dynamiccl._stub import not_implemented


def demo() -> None:
    """Run the whole loop on a simulated cluster: no Kubernetes, no GPU."""
    not_implemented("demo", 8)

"""`dynamiccl agent`: the per-job sidecar (issue #7)."""

from __future__ import annotations

from dynamiccl._stub import not_implemented


def agent() -> None:
    """Run the sidecar: table to shared memory, profiler ring to rewards."""
    not_implemented("agent", 7)

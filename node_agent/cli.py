"""`dynamiccl discover` and `dynamiccl node-agent` (node_agent issue #3)."""

from __future__ import annotations

from dynamiccl._stub import not_implemented


def discover() -> None:
    """Print this node's communication topology."""
    not_implemented("discover", 3)


def node_agent() -> None:
    """Run the node agent: discover periodically and publish to Kubernetes."""
    not_implemented("node-agent", 3)

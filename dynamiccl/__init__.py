"""DynamICCL: tunes NVIDIA NCCL for every distributed training job in a Kubernetes cluster.

The components live in the repository's top-level folders and are served here as
``dynamiccl.operator``, ``dynamiccl.policy``, ``dynamiccl.node_agent`` and
``dynamiccl.sidecar``; shared external shapes live in :mod:`dynamiccl.api`.
"""

__version__ = "0.1.0"

"""Names of the objects a job's sidecars coordinate through (the operator's and the sidecars').

Three ConfigMaps per tuned job, in the job's namespace, owned by the job:

- ``<job>-dynamiccl-epochs``: the epoch record (compare-and-swap on resourceVersion);
- ``<job>-dynamiccl-leader``: the proposer lease;
- ``<job>-dynamiccl-tables``: published decision tables, one key per slot
  (``version % TABLE_SLOTS``), each written with a one-key merge patch;
- ``<job>-dynamiccl-votes-<g>`` (g = 0 .. `vote_groups` - 1): the pods' ballots (vote,
  progress, needs), one key per pod, at most `GROUP_SIZE` pods per object
  (`group_of`), each written with a one-key merge patch; the leader reads them.

The operator creates all three (empty) when it first tunes the job and grants the
job's pods get/update/patch on exactly these names, nothing else: the sidecar never
needs to create or list anything, so its pod's service account gains no power over
any other object of the namespace.
"""

from __future__ import annotations

import hashlib
from typing import Final

TABLE_SLOTS: Final = 8  # a table stays readable until 8 newer versions are published
MAX_NAME: Final = 253
GROUP_SIZE: Final = 32  # pods per ballot object (docs/architecture.md, agreement at scale)


def object_name(job_name: str, suffix: str) -> str:
    """``<job>-dynamiccl-<suffix>``, shortened with a digest to fit 253 characters."""
    full = f"{job_name}-dynamiccl-{suffix}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    keep = MAX_NAME - len(suffix) - len(digest) - 12
    return f"{job_name[:keep].rstrip('-.')}-{digest}-dynamiccl-{suffix}"


def epochs_name(job_name: str) -> str:
    """The epoch record's ConfigMap."""
    return object_name(job_name, "epochs")


def leader_name(job_name: str) -> str:
    """The proposer lease's ConfigMap."""
    return object_name(job_name, "leader")


def tables_name(job_name: str) -> str:
    """The ConfigMap holding the published tables."""
    return object_name(job_name, "tables")


def table_key(version: int) -> str:
    """Key of a table version inside the tables ConfigMap."""
    if version < 1:
        raise ValueError(f"table version must be >= 1, got {version}")
    return f"slot-{version % TABLE_SLOTS}"


def coordination_names(job_name: str) -> tuple[str, str, str]:
    """(epochs, leader, tables): the three objects every job has."""
    return epochs_name(job_name), leader_name(job_name), tables_name(job_name)


def vote_groups(pods: int) -> int:
    """Ballot objects of a job of `pods` pods (operator and sidecars compute the same)."""
    return max(1, -(-pods // GROUP_SIZE))


def group_of(voter: str, groups: int) -> int:
    """The ballot object a pod writes: a stable hash of its name (no rank needed)."""
    digest = hashlib.sha256(voter.encode()).digest()
    return int.from_bytes(digest[:8], "big") % groups


def votes_name(job_name: str, group: int) -> str:
    """Ballot object `group` of the job."""
    return object_name(job_name, f"votes-{group}")


def votes_names(job_name: str, pods: int) -> tuple[str, ...]:
    """Every ballot object of a job of `pods` pods."""
    return tuple(votes_name(job_name, g) for g in range(vote_groups(pods)))

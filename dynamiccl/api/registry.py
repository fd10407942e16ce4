"""Model registry shapes: versions of the learned policy and how they move to production.

A retraining Job (`dynamiccl train --from-store URL --out DIR`) writes the model
file and a `TrainedModelManifest` (`DIR/manifest.json`) on the shared volume;
the operator checks the file's digest, registers the version as a `candidate`
in the experience store, sends it to the policy's canary share of new jobs
(`canary`), then `promoted` or `rolled_back` from the measured outcomes of
those jobs. When a version is promoted the previous promoted one is `retired`.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.rewards import ModelVersionName

SHA256_PATTERN: Final = r"^[0-9a-f]{64}$"
MANIFEST_FILE: Final = "manifest.json"
MAX_METRICS: Final = 256

Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]
Metrics = Annotated[dict[str, float], Field(max_length=MAX_METRICS)]


class ModelStatus(StrEnum):
    """Life cycle of a model version."""

    CANDIDATE = "candidate"  # registered, serves no job yet
    CANARY = "canary"  # serves the policy's canary share of new jobs
    PROMOTED = "promoted"  # serves every other new job
    ROLLED_BACK = "rolled_back"  # measured worse than the promoted version
    RETIRED = "retired"  # was promoted, superseded by a newer promotion


class ModelVersion(BaseModel):
    """One registered model version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: ModelVersionName
    sha256: Sha256
    uri: Annotated[str, Field(min_length=1, max_length=1024)]
    parent: ModelVersionName | None = None
    status: ModelStatus = ModelStatus.CANDIDATE
    created_unix_s: float
    status_changed_unix_s: float
    metrics: Metrics = Field(default_factory=dict)
    experience_cursor: Annotated[int, Field(ge=0)] = 0  # last experience row id trained on


class TrainedModelManifest(BaseModel):
    """What a training run leaves beside its model file (`DIR/manifest.json`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: ModelVersionName
    model_file: Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^/]+$")]
    sha256: Sha256
    parent: ModelVersionName | None = None
    metrics: Metrics = Field(default_factory=dict)
    experience_cursor: Annotated[int, Field(ge=0)] = 0


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

"""Model registry shapes: digests, manifest contract."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from dynamiccl.api.registry import ModelStatus, ModelVersion, TrainedModelManifest, file_sha256


def test_file_sha256_matches_hashlib(tmp_path: Path) -> None:
    f = tmp_path / "m.pt"
    data = bytes(range(256)) * 10_000  # > one read chunk
    f.write_bytes(data)
    assert file_sha256(f) == hashlib.sha256(data).hexdigest()


def test_model_version_validates_digest_and_name() -> None:
    ok = ModelVersion(
        version="v2",
        sha256="a" * 64,
        uri="file:///data/models/v2/model.pt",
        parent="v1",
        created_unix_s=1.0,
        status_changed_unix_s=1.0,
    )
    assert ok.status is ModelStatus.CANDIDATE
    with pytest.raises(ValidationError):
        ModelVersion(
            version="v2", sha256="A" * 64, uri="x", created_unix_s=1, status_changed_unix_s=1
        )
    with pytest.raises(ValidationError):
        ModelVersion(
            version="V2/../x", sha256="a" * 64, uri="x", created_unix_s=1, status_changed_unix_s=1
        )


def test_manifest_model_file_is_a_bare_name() -> None:
    with pytest.raises(ValidationError):
        TrainedModelManifest(version="v2", model_file="../etc/passwd", sha256="0" * 64)
    m = TrainedModelManifest(version="v2", model_file="model.pt", sha256="0" * 64)
    assert TrainedModelManifest.model_validate_json(m.model_dump_json()) == m

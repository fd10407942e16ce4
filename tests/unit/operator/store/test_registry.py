"""Model registry on the store's database (also run on PostgreSQL by the integration tier)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.registry import ModelStatus, TrainedModelManifest
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry, RegistryError

MakeRegistry = Callable[..., ModelRegistry]
SHA_A = "a" * 64
SHA_B = "b" * 64


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'experience.db'}"


@pytest.fixture
def make_registry(store_url: str) -> Iterator[MakeRegistry]:
    opened = []

    def make(**kw: Any) -> ModelRegistry:
        s = open_store(store_url)
        opened.append(s)
        return ModelRegistry(s.backend, clock=kw.get("clock", Clock()))

    yield make
    for s in opened:
        s.close()


def test_register_is_idempotent_per_digest(make_registry: MakeRegistry) -> None:
    reg = make_registry()
    mv = reg.register("v1", sha256=SHA_A, uri="/m/v1.pt", metrics={"eval/speedup": 1.2})
    assert mv.status is ModelStatus.CANDIDATE
    again = reg.register("v1", sha256=SHA_A, uri="/elsewhere")
    assert again == mv
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("v1", sha256=SHA_B, uri="/m/v1.pt")
    got = reg.get("v1")
    assert got is not None
    assert got.metrics == {"eval/speedup": 1.2}
    assert reg.get("nope") is None


def test_life_cycle_with_compare_and_swap(make_registry: MakeRegistry) -> None:
    reg = make_registry()
    reg.bootstrap("default", sha256=SHA_A, uri="/m/default.pt")
    promoted = reg.current(ModelStatus.PROMOTED)
    assert promoted is not None
    assert promoted.version == "default"
    reg.register("v2", sha256=SHA_B, uri="/m/v2.pt", parent="default")
    reg.transition("v2", ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
    with pytest.raises(RegistryError, match="is canary, expected candidate"):
        reg.transition("v2", ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
    reg.transition("v2", ModelStatus.PROMOTED, expected=ModelStatus.CANARY)
    statuses = {m.version: m.status for m in reg.list()}
    assert statuses == {"default": ModelStatus.RETIRED, "v2": ModelStatus.PROMOTED}
    assert [m.version for m in reg.list(ModelStatus.PROMOTED)] == ["v2"]
    with pytest.raises(RegistryError, match="not allowed"):
        reg.transition("v2", ModelStatus.CANARY, expected=ModelStatus.PROMOTED)
    with pytest.raises(RegistryError, match="not registered"):
        reg.transition("v9", ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
    # bootstrapping again (operator restart) changes nothing
    assert reg.bootstrap("default", sha256=SHA_A, uri="/m/default.pt").status is (
        ModelStatus.RETIRED
    )


def test_two_replicas_race_one_wins(make_registry: MakeRegistry) -> None:
    a, b = make_registry(), make_registry()
    a.register("v3", sha256=SHA_A, uri="/m/v3.pt")
    a.transition("v3", ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
    a.transition("v3", ModelStatus.ROLLED_BACK, expected=ModelStatus.CANARY)
    with pytest.raises(RegistryError):
        b.transition("v3", ModelStatus.PROMOTED, expected=ModelStatus.CANARY)
    got = b.get("v3")
    assert got is not None
    assert got.status is ModelStatus.ROLLED_BACK


def test_register_trained_checks_the_digest(make_registry: MakeRegistry, tmp_path: Path) -> None:
    reg = make_registry()
    out = tmp_path / "run1"
    out.mkdir()
    (out / "model.pt").write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    manifest = TrainedModelManifest(
        version="v5",
        model_file="model.pt",
        sha256=digest,
        parent="v2",
        metrics={"eval/regret": 0.01},
        experience_cursor=42,
    )
    (out / "manifest.json").write_text(manifest.model_dump_json())
    mv = reg.register_trained(out, uri_prefix="pvc://models/run1")
    assert (mv.version, mv.sha256, mv.parent, mv.uri) == (
        "v5",
        digest,
        "v2",
        "pvc://models/run1/model.pt",
    )
    assert reg.last_experience_cursor() == 42
    (out / "model.pt").write_bytes(b"tampered")
    with pytest.raises(RegistryError, match="does not match"):
        reg.register_trained(out)
    with pytest.raises(RegistryError, match="cannot read"):
        reg.register_trained(tmp_path / "missing")
    (out / "manifest.json").write_text('{"version": 1}')
    with pytest.raises(RegistryError, match="invalid manifest"):
        reg.register_trained(out)

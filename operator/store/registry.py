"""Model registry in the experience store: versions, digests, status with compare-and-swap.

Every status change is a conditional UPDATE (`... WHERE status = <expected>`),
so two operator replicas acting on the same verdict cannot both win; a
promotion retires the previous promoted version in the same transaction, so at
most one version is `promoted` at any time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.registry import (
    MANIFEST_FILE,
    ModelStatus,
    ModelVersion,
    TrainedModelManifest,
    file_sha256,
)
from dynamiccl.operator.learning.promotion import can_transition
from dynamiccl.operator.store.backend import Backend, StoreCursor

_COLS: Final = (
    "version, sha256, uri, parent, status, created_unix_s, status_changed_unix_s, "
    "metrics_json, experience_cursor"
)


class RegistryError(Exception):
    """A registry operation cannot be done; the message says why."""


def _row(r: tuple[Any, ...]) -> ModelVersion:
    return ModelVersion(
        version=r[0],
        sha256=r[1],
        uri=r[2],
        parent=r[3],
        status=ModelStatus(r[4]),
        created_unix_s=float(r[5]),
        status_changed_unix_s=float(r[6]),
        metrics=json.loads(r[7]),
        experience_cursor=int(r[8]),
    )


class ModelRegistry:
    """Model versions of the learned policy."""

    def __init__(self, backend: Backend, *, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self._clock = clock

    def register(
        self,
        version: str,
        *,
        sha256: str,
        uri: str,
        parent: str | None = None,
        metrics: Mapping[str, float] | None = None,
        experience_cursor: int = 0,
    ) -> ModelVersion:
        """Add a `candidate`; registering the same version with the same digest is a no-op."""
        now = self._clock()
        mv = ModelVersion(
            version=version,
            sha256=sha256,
            uri=uri,
            parent=parent,
            created_unix_s=now,
            status_changed_unix_s=now,
            metrics=dict(metrics or {}),
            experience_cursor=experience_cursor,
        )
        with self.backend.transaction() as cur:
            cur.execute(
                f"INSERT INTO models ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (version) DO NOTHING",
                (
                    mv.version,
                    mv.sha256,
                    mv.uri,
                    mv.parent,
                    mv.status.value,
                    now,
                    now,
                    json.dumps(mv.metrics, sort_keys=True),
                    mv.experience_cursor,
                ),
            )
            inserted = cur.rowcount == 1
            existing = mv if inserted else self._get(cur, version)
        if existing is None:  # pragma: no cover - deleted between the two statements
            raise RegistryError(f"model {version}: vanished while registering")
        if existing.sha256 != sha256:
            raise RegistryError(
                f"model {version} is already registered with digest {existing.sha256[:12]}…, "
                f"not {sha256[:12]}…"
            )
        return existing

    def register_trained(self, out_dir: Path, *, uri_prefix: str | None = None) -> ModelVersion:
        """Register what a training run left in `out_dir` after checking its digest."""
        manifest_path = out_dir / MANIFEST_FILE
        try:
            manifest = TrainedModelManifest.model_validate_json(manifest_path.read_bytes())
        except OSError as exc:
            raise RegistryError(f"{manifest_path}: cannot read: {exc.strerror}") from exc
        except ValueError as exc:
            raise RegistryError(f"{manifest_path}: invalid manifest: {exc}") from exc
        model_path = out_dir / manifest.model_file
        try:
            digest = file_sha256(model_path)
        except OSError as exc:
            raise RegistryError(f"{model_path}: cannot read: {exc.strerror}") from exc
        if digest != manifest.sha256:
            raise RegistryError(
                f"{model_path}: sha256 {digest[:12]}… does not match the manifest's "
                f"{manifest.sha256[:12]}…"
            )
        uri = f"{uri_prefix.rstrip('/')}/{manifest.model_file}" if uri_prefix else str(model_path)
        return self.register(
            manifest.version,
            sha256=digest,
            uri=uri,
            parent=manifest.parent,
            metrics=manifest.metrics,
            experience_cursor=manifest.experience_cursor,
        )

    def get(self, version: str) -> ModelVersion | None:
        with self.backend.transaction(write=False) as cur:
            return self._get(cur, version)

    @staticmethod
    def _get(cur: StoreCursor, version: str) -> ModelVersion | None:
        cur.execute(f"SELECT {_COLS} FROM models WHERE version = ?", (version,))
        r = cur.fetchone()
        return None if r is None else _row(r)

    def list(self, status: ModelStatus | None = None) -> list[ModelVersion]:
        """Versions, oldest first (optionally of one status)."""
        sql = f"SELECT {_COLS} FROM models"
        params: tuple[object, ...] = ()
        if status is not None:
            sql += " WHERE status = ?"
            params = (status.value,)
        with self.backend.transaction(write=False) as cur:
            cur.execute(sql + " ORDER BY created_unix_s, version", params)
            return [_row(r) for r in cur.fetchall()]

    def current(self, status: ModelStatus) -> ModelVersion | None:
        """The most recently changed version in `status` (e.g. the promoted one)."""
        with self.backend.transaction(write=False) as cur:
            cur.execute(
                f"SELECT {_COLS} FROM models WHERE status = ? "
                "ORDER BY status_changed_unix_s DESC, version DESC LIMIT 1",
                (status.value,),
            )
            r = cur.fetchone()
        return None if r is None else _row(r)

    def transition(self, version: str, to: ModelStatus, *, expected: ModelStatus) -> ModelVersion:
        """Compare-and-swap the status; RegistryError if it is not `expected` any more."""
        if to is ModelStatus.PROMOTED:
            return self.promote(version, expected=expected)
        if not can_transition(expected, to):
            raise RegistryError(f"model {version}: {expected.value} → {to.value} is not allowed")
        with self.backend.transaction() as cur:
            self._cas(cur, version, expected, to)
            out = self._get(cur, version)
        assert out is not None
        return out

    def promote(self, version: str, *, expected: ModelStatus) -> ModelVersion:
        """Make `version` the promoted one and retire the previous, atomically."""
        if not can_transition(expected, ModelStatus.PROMOTED):
            raise RegistryError(f"model {version}: {expected.value} → promoted is not allowed")
        with self.backend.transaction() as cur:
            self._cas(cur, version, expected, ModelStatus.PROMOTED)
            cur.execute(
                "UPDATE models SET status = ?, status_changed_unix_s = ? "
                "WHERE status = ? AND version <> ?",
                (
                    ModelStatus.RETIRED.value,
                    self._clock(),
                    ModelStatus.PROMOTED.value,
                    version,
                ),
            )
            out = self._get(cur, version)
        assert out is not None
        return out

    def _cas(self, cur: StoreCursor, version: str, expected: ModelStatus, to: ModelStatus) -> None:
        cur.execute(
            "UPDATE models SET status = ?, status_changed_unix_s = ? "
            "WHERE version = ? AND status = ?",
            (to.value, self._clock(), version, expected.value),
        )
        if cur.rowcount != 1:
            now = self._get(cur, version)
            state = "is not registered" if now is None else f"is {now.status.value}"
            raise RegistryError(f"model {version} {state}, expected {expected.value}")

    def bootstrap(self, version: str, *, sha256: str, uri: str) -> ModelVersion:
        """Register the shipped model and promote it when nothing is promoted yet."""
        mv = self.register(version, sha256=sha256, uri=uri)
        if self.current(ModelStatus.PROMOTED) is None and mv.status is ModelStatus.CANDIDATE:
            try:
                return self.promote(version, expected=ModelStatus.CANDIDATE)
            except RegistryError:  # another replica did it first
                pass
        got = self.get(version)
        assert got is not None
        return got

    def last_experience_cursor(self) -> int:
        """The newest experience row any registered model was trained on (0 if none)."""
        with self.backend.transaction(write=False) as cur:
            cur.execute("SELECT MAX(experience_cursor) FROM models")
            r = cur.fetchone()
        return int(r[0]) if r and r[0] is not None else 0

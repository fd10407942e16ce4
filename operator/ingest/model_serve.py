"""`GET /v1/models/{version}.npz` on the ingest endpoint: registered models for the operator.

Retraining writes `model.npz` (the torch-free export) next to `model.pt` on the
experience volume, which only the ingest process mounts. The operator compiles
tables from it (operator/controller/model_fetch.py) and fetches it here. Checks, in order:

    401  no / malformed bearer token, or the API server does not authenticate it
    403  a caller that is not one of the configured model readers (`--model-reader`,
         the operator's own ServiceAccount), or no reader configured
    404  a version that is not registered, or has no numpy export
    409  the export was not made from the registered model (its recorded source
         sha256 differs from the registry's): never a wrong model
    500  the export is unreadable
    503  the API server or the store is unavailable (retry)
    200  the archive bytes; header `X-DynamICCL-Model-Sha256`: the registry's digest
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
from aiohttp import web

from dynamiccl.api.registry import ModelVersion
from dynamiccl.operator.controller.model_fetch import SOURCE_HEADER, VERSION_RE
from dynamiccl.operator.ingest import http_answers
from dynamiccl.operator.ingest.auth import AuthBackendUnavailable, TokenReviewer

ROUTE: Final = "/v1/models/{version}.npz"
NPZ_SUFFIX: Final = ".npz"


class ExportError(Exception):
    """The version's export cannot be served; `status` and `error` say how to answer."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error


def npz_path(mv: ModelVersion) -> Path | None:
    """Where a version's numpy export is: next to its `.pt` (None for a non-local uri)."""
    uri = mv.uri.removeprefix("file://")
    if "://" in uri:
        return None
    return Path(uri).with_suffix(NPZ_SUFFIX)


def recorded_source(data: bytes) -> str:
    """The `.pt` sha256 an export records ("" when it records none); ValueError if unreadable."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return str(z["source_sha256"][()]) if "source_sha256" in z.files else ""
    except Exception as exc:
        raise ValueError(f"not an .npz archive: {type(exc).__name__}") from None


def read_export(mv: ModelVersion) -> bytes:
    """The export's bytes, after checking it was made from the registered `.pt`."""
    path = npz_path(mv)
    if path is None:
        raise ExportError(404, "not_exported", f"model {mv.version}: uri {mv.uri!r} is not local")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ExportError(404, "not_exported", f"model {mv.version} has no numpy export") from None
    except OSError as exc:
        raise ExportError(500, "unreadable", f"model {mv.version}: {exc.strerror}") from None
    try:
        source = recorded_source(data)
    except ValueError as exc:
        raise ExportError(500, "unreadable", f"model {mv.version}: {exc}") from None
    if source != mv.sha256:
        raise ExportError(
            409,
            "digest_mismatch",
            f"model {mv.version}: the export records source sha256 {source[:12] or '(none)'}, "
            f"the registry has {mv.sha256[:12]}; re-export it",
        )
    return data


@dataclass
class ModelServer:
    """The handler; `lookup` is the registry's `get` (blocking: run in a thread)."""

    reviewer: TokenReviewer
    lookup: Callable[[str], ModelVersion | None]
    readers: frozenset[str]  # usernames, e.g. system:serviceaccount:<ns>:<operator-sa>
    audience: str

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = http_answers.bearer_token(request)
        unauth = {"WWW-Authenticate": "Bearer"}
        if token is None:
            return http_answers.error(401, "unauthenticated", "missing bearer token", **unauth)
        try:
            caller = await self.reviewer.review(token, self.audience)
        except AuthBackendUnavailable as exc:
            return http_answers.error(503, "auth_unavailable", str(exc), **{"Retry-After": "2"})
        if caller is None:
            return http_answers.error(401, "unauthenticated", "token not valid", **unauth)
        if not self.readers:
            return http_answers.error(
                403, "forbidden", "model serving is off (no --model-reader configured)"
            )
        if caller.username not in self.readers:
            return http_answers.error(403, "forbidden", f"{caller.username!r} may not read models")
        version = request.match_info.get("version", "")
        if not VERSION_RE.fullmatch(version):
            return http_answers.error(404, "not_found", "not a valid version name")
        try:
            mv = await asyncio.to_thread(self.lookup, version)
        except Exception as exc:
            return http_answers.error(
                503, "store_unavailable", type(exc).__name__, **{"Retry-After": "2"}
            )
        if mv is None:
            return http_answers.error(404, "not_found", f"model {version} is not registered")
        try:
            data = await asyncio.to_thread(read_export, mv)
        except ExportError as exc:
            return http_answers.error(exc.status, exc.error, str(exc))
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={SOURCE_HEADER: mv.sha256, "Cache-Control": "no-store"},
        )

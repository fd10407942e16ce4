"""What the ingest process's HTTPS handlers share: reading the bearer token, JSON errors."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from dynamiccl.api.rewards import IngestError

MAX_TOKEN_LENGTH: Final = 16 * 1024


def bearer_token(request: web.Request) -> str | None:
    """The request's bearer token; None when absent, not Bearer, empty or oversized."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    return token


def error(status: int, error: str, detail: str = "", **headers: str) -> web.Response:
    """A JSON `IngestError` answer (detail cut to 500 characters)."""
    body = IngestError(error=error, detail=detail[:500]).model_dump_json()
    return web.Response(
        status=status, text=body, content_type="application/json", headers=headers or None
    )

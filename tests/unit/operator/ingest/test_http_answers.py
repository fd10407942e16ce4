"""Bearer-token reading and JSON error answers shared by the ingest's handlers."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import make_mocked_request

from dynamiccl.operator.ingest.http_answers import MAX_TOKEN_LENGTH, bearer_token, error


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
        ("Bearer " + "x" * (MAX_TOKEN_LENGTH + 1), None),
    ],
)
def test_bearer_token(header: str, want: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    assert bearer_token(make_mocked_request("GET", "/", headers=headers)) == want


def test_error_is_json_with_a_bounded_detail_and_headers() -> None:
    resp = error(401, "unauthenticated", "d" * 600, **{"WWW-Authenticate": "Bearer"})
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert resp.text is not None
    body = json.loads(resp.text)
    assert body["error"] == "unauthenticated"
    assert len(body["detail"]) == 500

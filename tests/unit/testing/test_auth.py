"""The demo's token stand-ins: pod-bound, audience-bound, expiring, unforgeable."""

from __future__ import annotations

import asyncio
import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl import constants as c
from dynamiccl.api.rewards import JobRef
from dynamiccl.testing import builders
from dynamiccl.testing.auth import LocalPodJobResolver, LocalTokenReviewer, TokenIssuer

_JOB = builders.pytorchjob("job", namespace="ml-team", uid="job-uid")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _review(reviewer: LocalTokenReviewer, token: str, audience: str = c.INGEST_AUDIENCE) -> object:
    return asyncio.run(reviewer.review(token, audience))


def test_a_pod_token_names_its_service_account_and_pod() -> None:
    clock = Clock()
    issuer = TokenIssuer(b"s" * 32, clock)
    token = issuer.issue("ml-team", "trainer", "job-master-0", "uid-1")
    caller = _review(LocalTokenReviewer(issuer, clock), token)
    assert caller is not None
    assert caller.namespace == "ml-team"  # type: ignore[attr-defined]
    assert caller.service_account == "trainer"  # type: ignore[attr-defined]
    assert (caller.pod_name, caller.pod_uid) == ("job-master-0", "uid-1")  # type: ignore[attr-defined]


def test_wrong_audience_expired_forged_or_foreign_tokens_are_refused() -> None:
    clock = Clock()
    issuer = TokenIssuer(b"s" * 32, clock)
    reviewer = LocalTokenReviewer(issuer, clock)
    token = issuer.issue("ns", "sa", "p", "u", ttl_s=60)
    assert _review(reviewer, token, "kubernetes") is None
    other = TokenIssuer(b"t" * 32, clock).issue("ns", "sa", "p", "u")
    assert _review(reviewer, other) is None
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["kubernetes.io"]["namespace"] = "victim"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert _review(reviewer, f"{head}.{forged}.{sig}") is None
    clock.now += 61
    assert _review(reviewer, token) is None


@given(st.text(max_size=300))
def test_verify_never_raises(text: str) -> None:
    issuer = TokenIssuer(b"k" * 32)
    assert issuer.verify(text) is None or isinstance(issuer.verify(text), dict)


def test_the_resolver_finds_the_job_of_a_live_pod_only() -> None:
    pod = builders.pod_of(_JOB, 0, replica="Master", uid="uid-1")
    res = LocalPodJobResolver()
    res.add_pod(pod)
    got = asyncio.run(res.job_of_pod("ml-team", "job-master-0", "uid-1"))
    assert got == JobRef(namespace="ml-team", kind="PyTorchJob", name="job", uid="job-uid")
    assert asyncio.run(res.job_of_pod("ml-team", "job-master-0", "uid-2")) is None
    res.remove_pod("ml-team", "job-master-0")
    assert asyncio.run(res.job_of_pod("ml-team", "job-master-0", "uid-1")) is None

"""Authorisation rules, owner chains, token-review caches (pure / in-memory)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl import constants as c
from dynamiccl.api.rewards import JobRef, RewardBatch
from dynamiccl.operator.ingest.auth import (
    CachingPodJobResolver,
    CachingTokenReviewer,
    CachingTunedJobs,
    Caller,
    authorize,
    caller_from_review,
    job_from_owner_chain,
    token_expiry,
    verified_job,
)

JOB = JobRef(namespace="team-a", kind="PyTorchJob", name="llm", uid="job-1")
POD = {"name": "llm-worker-0", "uid": "pod-1"}
CALLER = Caller(
    "system:serviceaccount:team-a:default", "team-a", "default", "llm-worker-0", "pod-1"
)


def batch(**over: Any) -> RewardBatch:
    b: dict[str, Any] = {
        "idempotency_key": "pod-1/1",
        "job": JOB.model_dump(),
        "pod": POD,
        "model_version": "v1",
        "table_version": 0,
        "records": [
            {
                "collective": "allreduce",
                "size_bucket": 10,
                "nbytes_min": 1024,
                "nbytes_max": 2047,
                "nranks": 2,
                "nnodes": 1,
                "algo": "ring",
                "proto": "ll",
                "nchannels": 0,
                "chunk_bytes": 0,
                "origin": "table",
                "count": 1,
                "mean_time_us": 5.0,
                "p50_time_us": 5.0,
                "p99_time_us": 5.0,
                "busbw_GBps": 1.0,
                "nccl_default_time_us": 6.0,
            }
        ],
    }
    b.update(over)
    return RewardBatch.model_validate(b)


def test_caller_from_review() -> None:
    extra = {c.TOKENREVIEW_EXTRA_POD_NAME: ["p"], c.TOKENREVIEW_EXTRA_POD_UID: ["u"]}
    got = caller_from_review("system:serviceaccount:ns:sa", extra)
    assert got == Caller("system:serviceaccount:ns:sa", "ns", "sa", "p", "u")
    plain = caller_from_review("alice", {})
    assert (plain.namespace, plain.pod_name) == (None, None)
    # ambiguous extra values are not trusted
    two = caller_from_review(
        "system:serviceaccount:ns:sa", {c.TOKENREVIEW_EXTRA_POD_NAME: ["a", "b"]}
    )
    assert two.pod_name is None


def test_authorize_accepts_own_job() -> None:
    assert authorize(CALLER, batch(), JOB) is None


@pytest.mark.parametrize(
    ("caller", "job", "match"),
    [
        (Caller("alice", None, None, None, None), JOB, "not a ServiceAccount"),
        (
            Caller("system:serviceaccount:b:d", "team-b", "d", "llm-worker-0", "pod-1"),
            JOB,
            "namespace",
        ),
        (
            Caller("system:serviceaccount:team-a:d", "team-a", "d", None, None),
            JOB,
            "not bound to a pod",
        ),
        (
            Caller("system:serviceaccount:team-a:d", "team-a", "d", "other", "pod-9"),
            JOB,
            "bound to pod",
        ),
        (CALLER, None, "no training job"),
        (CALLER, JOB.model_copy(update={"name": "other"}), "belongs to PyTorchJob 'other'"),
        (CALLER, JOB.model_copy(update={"uid": "job-2"}), "uid job-2"),
    ],
)
def test_authorize_rejects(caller: Caller, job: JobRef | None, match: str) -> None:
    reason = authorize(caller, batch(), job)
    assert reason is not None
    assert match in reason


def owner(kind: str, name: str, uid: str, api: str = "kubeflow.org/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def obj(uid: str, *owners: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "ownerReferences": list(owners)}}


INTER = frozenset({"Job", "JobSet"})


def test_owner_chain_pytorchjob() -> None:
    pod = obj("p", {"kind": "Node", "name": "x", "uid": "n"}, owner("PyTorchJob", "llm", "job-1"))
    got = job_from_owner_chain("team-a", pod, lambda *a: None, INTER)
    assert got == JOB


def test_owner_chain_through_job_and_jobset_to_trainjob() -> None:
    objects: Mapping[tuple[str, str], dict[str, Any]] = {
        ("Job", "tj-node-0"): obj("j1", owner("JobSet", "tj", "js1", "jobset.x-k8s.io/v1alpha2")),
        ("JobSet", "tj"): obj(
            "js1", owner("TrainJob", "tj", "tj1", "trainer.kubeflow.org/v1alpha1")
        ),
    }
    reads: list[tuple[str, str, str]] = []

    def read(api: str, kind: str, name: str) -> Mapping[str, Any] | None:
        reads.append((api, kind, name))
        return objects.get((kind, name))

    pod = obj("p", owner("Job", "tj-node-0", "j1", "batch/v1"))
    got = job_from_owner_chain("ns", pod, read, INTER)
    assert got == JobRef(namespace="ns", kind="TrainJob", name="tj", uid="tj1")
    assert [r[1] for r in reads] == ["Job", "JobSet"]
    # a JobSet without an owner is itself the job
    lone = {
        ("Job", "a"): obj("j1", owner("JobSet", "js", "js1", "jobset.x-k8s.io/v1alpha2")),
        ("JobSet", "js"): obj("js1"),
    }
    pod = obj("p", owner("Job", "a", "j1", "batch/v1"))
    assert job_from_owner_chain("ns", pod, lambda _a, k, n: lone.get((k, n)), INTER) == JobRef(
        namespace="ns", kind="JobSet", name="js", uid="js1"
    )


def test_owner_chain_rejects_uid_mismatch_missing_owner_and_no_controller() -> None:
    pod = obj("p", owner("Job", "j", "uid-A", "batch/v1"))
    assert job_from_owner_chain("ns", pod, lambda *a: obj("uid-B"), INTER) is None
    assert job_from_owner_chain("ns", pod, lambda *a: None, INTER) is None
    assert job_from_owner_chain("ns", {"metadata": {}}, lambda *a: None, INTER) is None
    not_ctrl = obj("p", {**owner("PyTorchJob", "x", "y"), "controller": False})
    assert job_from_owner_chain("ns", not_ctrl, lambda *a: None, INTER) is None


def test_owner_chain_is_bounded() -> None:
    loop_obj = obj("j", owner("Job", "j", "j", "batch/v1"))  # a Job owning itself
    assert job_from_owner_chain("ns", loop_obj, lambda *a: loop_obj, INTER) is None


def jwt(payload: object) -> str:
    enc = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{enc}.sig"


def test_token_expiry() -> None:
    assert token_expiry(jwt({"exp": 1234})) == 1234.0
    assert token_expiry(jwt({"exp": True})) is None
    assert token_expiry(jwt([1])) is None
    assert token_expiry("not-a-jwt") is None
    assert token_expiry("a.!!!.c") is None


@given(st.text(max_size=300))
def test_token_expiry_never_raises(token: str) -> None:
    token_expiry(token)


class CountingReviewer:
    def __init__(self, answer: Caller | None) -> None:
        self.answer = answer
        self.calls = 0

    async def review(self, token: str, audience: str) -> Caller | None:
        self.calls += 1
        return self.answer


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_caching_reviewer_ttl_and_token_exp() -> None:
    clock = Clock()
    inner = CountingReviewer(CALLER)
    cache = CachingTokenReviewer(inner, ttl_s=60, clock=clock)
    tok = jwt({"exp": 1030})
    for _ in range(3):
        assert asyncio.run(cache.review(tok, "aud")) == CALLER
    assert inner.calls == 1
    asyncio.run(cache.review(tok, "other-aud"))  # audience is part of the key
    assert inner.calls == 2
    clock.t = 1031  # past the token's exp (before the 60 s TTL): asked again
    asyncio.run(cache.review(tok, "aud"))
    assert inner.calls == 3
    assert (cache.hits, cache.misses) == (2, 3)


def test_caching_reviewer_negative_answers_expire_fast() -> None:
    clock = Clock()
    inner = CountingReviewer(None)
    cache = CachingTokenReviewer(inner, ttl_s=60, negative_ttl_s=5, clock=clock)
    assert asyncio.run(cache.review("forged", "aud")) is None
    assert asyncio.run(cache.review("forged", "aud")) is None
    assert inner.calls == 1
    clock.t += 6
    asyncio.run(cache.review("forged", "aud"))
    assert inner.calls == 2


def test_caching_resolver_caches_only_found_jobs() -> None:
    answers: list[JobRef | None] = [None, JOB]
    calls: list[str] = []

    class Inner:
        async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
            calls.append(pod_name)
            return answers[min(len(calls) - 1, 1)]

    r = CachingPodJobResolver(Inner(), clock=Clock())
    assert asyncio.run(r.job_of_pod("ns", "p", "u")) is None
    assert asyncio.run(r.job_of_pod("ns", "p", "u")) == JOB
    assert asyncio.run(r.job_of_pod("ns", "p", "u")) == JOB
    assert len(calls) == 2


# --- issue 19: every owner read, tuned jobs, assigned model versions ----------------------
def test_verified_job_reads_every_owner_and_rejects_unknown_kinds() -> None:
    pt = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"uid": "job-1"}}
    known = {("PyTorchJob", "llm"): pt}

    def read(_api: str, kind: str, name: str) -> Mapping[str, Any] | None:
        return known.get((kind, name))

    pod = obj("p", owner("PyTorchJob", "llm", "job-1"))
    assert verified_job("team-a", pod, read, INTER) == (JOB, pt)
    # the PyTorchJob exists but with another uid: a forged reference
    assert verified_job("team-a", obj("p", owner("PyTorchJob", "llm", "x")), read, INTER) is None
    # a kind nobody reads (a ReplicaSet, a made-up kind): no job
    rs = obj("p", owner("ReplicaSet", "web-1", "rs1", "apps/v1"))
    assert verified_job("team-a", rs, lambda *a: obj("rs1"), INTER) is None
    # a training job with a controller of its own is not ours to judge
    owned = {"metadata": {"uid": "job-1", "ownerReferences": [owner("Thing", "t", "t1")]}}
    assert verified_job("team-a", pod, lambda *a: owned, INTER) is None
    assert verified_job("team-a", {"metadata": {}}, read, INTER) is None


@pytest.mark.parametrize(
    ("assigned", "match"),
    [(None, "not a job DynamICCL tunes"), ("v2", "assigned model 'v2'")],
)
def test_authorize_checks_the_assigned_model(assigned: str | None, match: str) -> None:
    assert authorize(CALLER, batch(), JOB, "v1") is None
    reason = authorize(CALLER, batch(), JOB, assigned)
    assert reason is not None
    assert match in reason


def test_caching_tuned_jobs_ttl_and_bounded_refresh() -> None:
    clock = Clock()
    answers = ["v1", "v2"]
    calls: list[JobRef] = []

    class Inner:
        async def assigned_model(self, job: JobRef) -> str | None:
            calls.append(job)
            return answers[min(len(calls) - 1, 1)]

    t = CachingTunedJobs(Inner(), ttl_s=30, min_refresh_s=2, clock=clock)
    assert asyncio.run(t.assigned_model(JOB)) == "v1"
    assert asyncio.run(t.assigned_model(JOB)) == "v1"
    assert len(calls) == 1
    assert not t.refresh(JOB)  # fetched just now: a wrong version cannot force a lookup
    clock.t += 2.5
    assert t.refresh(JOB)
    assert asyncio.run(t.assigned_model(JOB)) == "v2"
    assert len(calls) == 2

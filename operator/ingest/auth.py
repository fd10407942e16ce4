"""Who may report rewards for which job — the ingest endpoint's auth layer.

The rules and the attacks they stop: docs/security.md, 'Reward ingest: who may report what'.

A sidecar authenticates with its pod's projected ServiceAccount token (audience
`dynamiccl-ingest`). The operator asks the API server (TokenReview) who the
token belongs to; a pod-bound token's review names the pod
(`authentication.kubernetes.io/pod-name` / `pod-uid`). The pod's controller
owner chain (pod → [Job → JobSet →] PyTorchJob / MPIJob / TrainJob / JobSet)
names the job. A batch is authorised only when its namespace, pod and job are
exactly those.

The API server is reached through two small interfaces, `TokenReviewer` and
`PodJobResolver`; operator/ingest/kube.py implements them with the Kubernetes
client, tests can implement them directly. Both are wrapped in TTL caches here
(a review is cached no longer than the token's own `exp`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dynamiccl import constants as c
from dynamiccl.api.rewards import JobRef, RewardBatch

SA_USER_PREFIX: Final = "system:serviceaccount:"


class NotChecked:
    """`authorize`'s default for `assigned`: the model-version check is not made."""


NOT_CHECKED: Final = NotChecked()
MAX_OWNER_DEPTH: Final = 4
# every kind an owner of a tuned pod may have: batch Job and JobSet in between, the job on top
OWNER_KINDS: Final = frozenset({"Job", "JobSet", "PyTorchJob", "MPIJob", "TrainJob"})


class AuthBackendUnavailable(Exception):  # noqa: N818 - an outcome: answer 503, client retries
    """The API server could not be asked; the request may be retried."""


@dataclass(frozen=True)
class Caller:
    """An authenticated token's identity."""

    username: str
    namespace: str | None  # of the ServiceAccount; None for non-SA users
    service_account: str | None
    pod_name: str | None  # set only for pod-bound tokens
    pod_uid: str | None


def caller_from_review(username: str, extra: Mapping[str, list[str]]) -> Caller:
    """Build a Caller from a TokenReview status' user (`username`, `extra`)."""
    ns = sa = None
    if username.startswith(SA_USER_PREFIX):
        parts = username[len(SA_USER_PREFIX) :].split(":")
        if len(parts) == 2 and all(parts):
            ns, sa = parts

    def one(key: str) -> str | None:
        vals = extra.get(key) or []
        return vals[0] if len(vals) == 1 and vals[0] else None

    return Caller(
        username=username,
        namespace=ns,
        service_account=sa,
        pod_name=one(c.TOKENREVIEW_EXTRA_POD_NAME),
        pod_uid=one(c.TOKENREVIEW_EXTRA_POD_UID),
    )


class TokenReviewer(Protocol):
    """Asks the API server who a bearer token belongs to."""

    async def review(self, token: str, audience: str) -> Caller | None:
        """The caller, or None when the token is not authenticated for `audience`.

        Raises AuthBackendUnavailable when the API server cannot answer.
        """
        ...


class PodJobResolver(Protocol):
    """Finds the training job a pod belongs to."""

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        """The job, or None when the pod is gone, has another uid, or has no job owner.

        Raises AuthBackendUnavailable when the API server cannot answer.
        """
        ...


class TunedJobs(Protocol):
    """What the operator decided for a job: its TuningRun (operator/controller/tuningrun.py)."""

    async def assigned_model(self, job: JobRef) -> str | None:
        """The model version the operator assigned to `job`, or None when DynamICCL does not
        tune it (no TuningRun, a TuningRun of another job uid, or one that is not tuned).

        Raises AuthBackendUnavailable when the API server cannot answer.
        """
        ...


def authorize(
    caller: Caller,
    batch: RewardBatch,
    job: JobRef | None,
    assigned: str | NotChecked | None = NOT_CHECKED,
) -> str | None:
    """None when `caller` may store `batch`; else the reason to answer 403.

    `assigned`: the model version the operator assigned to the job (None: the job is
    not one DynamICCL tunes); left out, that check is not made (tests, the demo).
    """
    if caller.namespace is None:
        return f"user {caller.username!r} is not a ServiceAccount"
    if caller.namespace != batch.job.namespace:
        return (
            f"a token of namespace {caller.namespace!r} cannot report for namespace "
            f"{batch.job.namespace!r}"
        )
    if caller.pod_name is None or caller.pod_uid is None:
        return "the token is not bound to a pod (use a projected ServiceAccount token)"
    if (caller.pod_name, caller.pod_uid) != (batch.pod.name, batch.pod.uid):
        return f"the token is bound to pod {caller.pod_name!r}, the batch names {batch.pod.name!r}"
    if job is None:
        return f"pod {caller.pod_name!r} belongs to no training job"
    if job != batch.job:
        return (
            f"pod {caller.pod_name!r} belongs to {job.kind} {job.name!r} (uid {job.uid}), "
            f"not to {batch.job.kind} {batch.job.name!r} (uid {batch.job.uid})"
        )
    if isinstance(assigned, NotChecked):
        return None
    if assigned is None:
        return f"{job.kind} {job.name!r} is not a job DynamICCL tunes (no tuned TuningRun)"
    if batch.model_version != assigned:
        return (
            f"{job.kind} {job.name!r} was assigned model {assigned!r}, "
            f"the batch reports {batch.model_version!r}"
        )
    return None


# --- owner chain ----------------------------------------------------------------
ReadOwner = Callable[[str, str, str], Mapping[str, Any] | None]  # (apiVersion, kind, name)


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def job_from_owner_chain(
    namespace: str, pod: Mapping[str, Any], read: ReadOwner, intermediate: frozenset[str]
) -> JobRef | None:
    """Walk controller owners from the pod up; the top-most one is the job.

    Owners whose kind is in `intermediate` (e.g. batch Job, JobSet) are read
    (`read(apiVersion, kind, name)`) to continue upwards; the walk stops at an
    owner of any other kind, at an object without a controller, or after
    MAX_OWNER_DEPTH steps. Each read object must carry the uid its reference
    named. The pod itself is never a job.
    """
    ref = controller_ref(pod)
    if ref is None:
        return None
    for _ in range(MAX_OWNER_DEPTH):
        kind, name, uid = str(ref.get("kind", "")), str(ref.get("name", "")), ref.get("uid")
        here = JobRef(namespace=namespace, kind=kind, name=name, uid=str(uid))
        if kind not in intermediate:
            return here
        obj = read(str(ref.get("apiVersion", "")), kind, name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        parent = controller_ref(obj)
        if parent is None:
            return here
        ref = parent
    return None


def verified_job(
    namespace: str,
    pod: Mapping[str, Any],
    read: ReadOwner,
    intermediate: frozenset[str],
) -> tuple[JobRef, Mapping[str, Any]] | None:
    """The job a pod really belongs to, and the job object; None when any link is forged.

    Stricter than `job_from_owner_chain`: EVERY controller owner is read with
    `read` and must exist with the uid its reference names; an owner of a kind
    not in OWNER_KINDS (a ReplicaSet, a made-up kind) ends the walk with None.
    The top-most owner is the job (a bare batch Job too: whether DynamICCL
    tunes it is the TuningRun's to say, `TunedJobs`).
    """
    ref = controller_ref(pod)
    for _ in range(MAX_OWNER_DEPTH):
        if ref is None:
            return None
        kind, name, uid = str(ref.get("kind", "")), str(ref.get("name", "")), ref.get("uid")
        if kind not in OWNER_KINDS:
            return None
        obj = read(str(ref.get("apiVersion", "")), kind, name)
        if obj is None or not uid or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        parent = controller_ref(obj)
        if parent is None:
            return JobRef(namespace=namespace, kind=kind, name=name, uid=str(uid)), obj
        if kind not in intermediate:
            return None  # a training job owned by something else: not ours to judge
        ref = parent
    return None


# --- caches ---------------------------------------------------------------------
def token_expiry(token: str) -> float | None:
    """The JWT `exp` claim, read WITHOUT verification (only to bound cache lifetimes)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class _TTLCache:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[object, tuple[float, object]] = OrderedDict()

    def get(self, key: object, now: float) -> tuple[bool, object]:
        hit = self._data.get(key)
        if hit is None or hit[0] <= now:
            self._data.pop(key, None)
            return False, None
        self._data.move_to_end(key)
        return True, hit[1]

    def put(self, key: object, value: object, until: float) -> None:
        self._data[key] = (until, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def drop(self, key: object) -> None:
        self._data.pop(key, None)


class CachingTokenReviewer:
    """TokenReviewer with a TTL cache (never past the token's `exp`); failures cached briefly."""

    def __init__(
        self,
        inner: TokenReviewer,
        *,
        ttl_s: float = 60.0,
        negative_ttl_s: float = 5.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inner = inner
        self._ttl = ttl_s
        self._neg_ttl = negative_ttl_s
        self._cache = _TTLCache(max_entries)
        self._clock = clock
        self.hits = 0
        self.misses = 0

    async def review(self, token: str, audience: str) -> Caller | None:
        key = (hashlib.sha256(token.encode()).digest(), audience)
        now = self._clock()
        found, value = self._cache.get(key, now)
        if found:
            self.hits += 1
            return value  # type: ignore[return-value]
        self.misses += 1
        caller = await self._inner.review(token, audience)
        until = now + (self._ttl if caller is not None else self._neg_ttl)
        exp = token_expiry(token)
        if exp is not None:
            until = min(until, exp)
        if until > now:
            self._cache.put(key, caller, until)
        return caller


class CachingPodJobResolver:
    """PodJobResolver caching found jobs per pod uid (owners of a pod never change)."""

    def __init__(
        self,
        inner: PodJobResolver,
        *,
        ttl_s: float = 600.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inner = inner
        self._ttl = ttl_s
        self._cache = _TTLCache(max_entries)
        self._clock = clock

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        key = (namespace, pod_name, pod_uid)
        now = self._clock()
        found, value = self._cache.get(key, now)
        if found:
            return value  # type: ignore[return-value]
        job = await self._inner.job_of_pod(namespace, pod_name, pod_uid)
        if job is not None:
            self._cache.put(key, job, now + self._ttl)
        return job


class CachingTunedJobs:
    """TunedJobs with a short TTL cache per job (namespace, name, uid).

    A TuningRun changes rarely (a model rollout), so an answer is kept `ttl_s`
    (a job that is not tuned: `negative_ttl_s`). `refresh(job)` drops the entry
    when it is older than `min_refresh_s`: the endpoint calls it once when a
    batch's model version differs from the cached one (a rollout just changed it),
    and a caller sending wrong versions cannot make it ask the API server more
    than once per `min_refresh_s` per job.
    """

    def __init__(
        self,
        inner: TunedJobs,
        *,
        ttl_s: float = 30.0,
        negative_ttl_s: float = 5.0,
        min_refresh_s: float = 2.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inner = inner
        self._ttl = ttl_s
        self._neg_ttl = negative_ttl_s
        self._min_refresh = min_refresh_s
        self._cache = _TTLCache(max_entries)
        self._fetched: dict[tuple[str, str, str], float] = {}
        self._clock = clock

    async def assigned_model(self, job: JobRef) -> str | None:
        key = (job.namespace, job.name, job.uid)
        now = self._clock()
        found, value = self._cache.get(key, now)
        if found:
            return value  # type: ignore[return-value]
        version = await self._inner.assigned_model(job)
        self._cache.put(key, version, now + (self._ttl if version is not None else self._neg_ttl))
        if len(self._fetched) >= 2 * self._cache.max_entries:
            self._fetched.clear()
        self._fetched[key] = now
        return version

    def refresh(self, job: JobRef) -> bool:
        """Forget the cached answer for `job` unless it is fresher than `min_refresh_s`."""
        key = (job.namespace, job.name, job.uid)
        if self._clock() - self._fetched.get(key, 0.0) < self._min_refresh:
            return False
        self._cache.drop(key)
        return True

"""The ingest endpoint's Kubernetes adapter: TokenReview and the pod → job lookup.

Implements `TokenReviewer`, `PodJobResolver` and `TunedJobs` (operator/ingest/auth.py)
with the official client (blocking calls run in worker threads). RBAC the ingest
needs (its own ServiceAccount, charts/dynamiccl/templates/rbac.yaml): `create` on
`authentication.k8s.io/tokenreviews`; `get` on `pods`, `batch/jobs`, the job kinds
(`jobsets`, `pytorchjobs`, `mpijobs`, `trainjobs`: every owner of a pod is read and
must exist with the uid the pod names) and `dynamiccl.io/tuningruns` (the model
version the operator assigned).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.rewards import JobRef
from dynamiccl.kubeclient import REQUEST_TIMEOUT_S
from dynamiccl.operator.controller.configmap import object_name
from dynamiccl.operator.controller.jobkinds import info_for
from dynamiccl.operator.controller.sidecar_access import service_accounts
from dynamiccl.operator.ingest.auth import (
    AuthBackendUnavailable,
    Caller,
    caller_from_review,
    verified_job,
)

# Owners we read to continue upwards: a batch Job (MPIJob launcher, JobSet child)
# and a JobSet (TrainJob child). Anything else at the top is the job.
INTERMEDIATE_KINDS: Final = frozenset({"Job", "JobSet"})


def assigned_model_of(run: Mapping[str, Any], job: JobRef) -> str | None:
    """The model version a TuningRun assigns to `job` (None: of another job, or not tuned)."""
    spec = run.get("spec") or {}
    ref = spec.get("jobRef") or {}
    if (ref.get("uid"), ref.get("kind"), ref.get("name")) != (job.uid, job.kind, job.name):
        return None
    version = spec.get("modelVersion")
    if not spec.get("configMapName") or not isinstance(version, str) or not version:
        return None  # decided not to tune it
    return version


class KubeIngestAuth:
    """TokenReview + owner-chain lookup against the API server."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._api = api
        self._timeout = timeout_s
        self._authn = client.AuthenticationV1Api(api)
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    async def review(self, token: str, audience: str) -> Caller | None:
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[audience])
        )
        try:
            res = await asyncio.to_thread(
                self._authn.create_token_review, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            raise AuthBackendUnavailable(f"TokenReview failed: HTTP {exc.status}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise AuthBackendUnavailable(f"TokenReview failed: {type(exc).__name__}") from exc
        st = res.status
        if st is None or not st.authenticated or st.user is None:
            return None
        if audience not in (st.audiences or []):
            return None
        return caller_from_review(st.user.username or "", st.user.extra or {})

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        return await asyncio.to_thread(self._job_of_pod, namespace, pod_name, pod_uid)

    def _job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        pod = self._read(
            lambda: self._core.read_namespaced_pod(
                pod_name, namespace, _request_timeout=self._timeout
            )
        )
        if pod is None or (pod.get("metadata") or {}).get("uid") != pod_uid:
            return None

        def read_owner(api_version: str, kind: str, name: str) -> Mapping[str, Any] | None:
            """The owner object, only for the kinds we know (None for anything else)."""
            if kind == "Job" and api_version == "batch/v1":
                return self._read(
                    lambda: self._batch.read_namespaced_job(
                        name, namespace, _request_timeout=self._timeout
                    )
                )
            info = info_for(api_version, kind)
            if info is None:
                return None
            return self._read(
                lambda: self._custom.get_namespaced_custom_object(
                    info.group,
                    info.version,
                    namespace,
                    info.plural,
                    name,
                    _request_timeout=self._timeout,
                )
            )

        found = verified_job(namespace, pod, read_owner, INTERMEDIATE_KINDS)
        if found is None:
            return None
        job, obj = found
        # the pod runs as one of the ServiceAccounts the job's templates name (when the job
        # object says; a TrainJob's come from its runtime): a pod of another team's
        # ServiceAccount cannot claim the job by copying its ownerReference
        accounts = service_accounts(obj)
        pod_sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        if accounts is not None and pod_sa not in accounts:
            return None
        return job

    async def assigned_model(self, job: JobRef) -> str | None:
        return await asyncio.to_thread(self._assigned_model, job)

    def _assigned_model(self, job: JobRef) -> str | None:
        run = self._read(
            lambda: self._custom.get_namespaced_custom_object(
                c.GROUP,
                c.API_VERSION,
                job.namespace,
                "tuningruns",
                object_name(job.name),
                _request_timeout=self._timeout,
            )
        )
        return None if run is None else assigned_model_of(run, job)

    def _read(self, call: Any) -> Mapping[str, Any] | None:
        """Run a GET; the object as a plain dict, None on 404."""
        try:
            obj = call()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise AuthBackendUnavailable(f"lookup failed: HTTP {exc.status}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise AuthBackendUnavailable(f"lookup failed: {type(exc).__name__}") from exc
        if isinstance(obj, Mapping):
            return obj
        out = self._api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return out if isinstance(out, Mapping) else None

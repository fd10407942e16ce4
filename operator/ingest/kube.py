"""The ingest endpoint's Kubernetes adapter: TokenReview and the pod → job lookup.

Implements `TokenReviewer` and `PodJobResolver` (operator/ingest/auth.py) with
the official client (blocking calls run in worker threads). RBAC the operator
needs: `create` on `authentication.k8s.io/tokenreviews`; `get` on `pods`,
`batch/jobs` and `jobset.x-k8s.io/jobsets` (to walk owner chains).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dynamiccl.api.rewards import JobRef
from dynamiccl.kubeclient import REQUEST_TIMEOUT_S
from dynamiccl.operator.controller.jobkinds import info_for
from dynamiccl.operator.ingest.auth import (
    AuthBackendUnavailable,
    Caller,
    caller_from_review,
    job_from_owner_chain,
)

# Owners we read to continue upwards: a batch Job (MPIJob launcher, JobSet child)
# and a JobSet (TrainJob child). Anything else at the top is the job.
INTERMEDIATE_KINDS: Final = frozenset({"Job", "JobSet"})


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

        return job_from_owner_chain(namespace, pod, read_owner, INTERMEDIATE_KINDS)

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

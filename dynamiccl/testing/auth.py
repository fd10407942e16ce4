"""The demo's stand-in for Kubernetes authentication: pod-bound tokens without an API server.

In a cluster the kubelet mounts each pod a projected ServiceAccount token
(audience `dynamiccl-ingest`, bound to the pod), and the reward-ingest
endpoint asks the API server who a token belongs to (TokenReview) and which
job a pod belongs to (its owner chain). The demo has no API server, so:

- `TokenIssuer` plays the kubelet + token controller: it signs (HMAC-SHA256)
  a JWT naming the ServiceAccount, the pod (name, uid), the audience and an
  expiry, as a real bound token does;
- `LocalTokenReviewer` implements the ingest's `TokenReviewer` Protocol: it
  checks signature, audience and expiry and answers the caller the way a
  TokenReview status would (`caller_from_review` is the ingest's own parser);
- `LocalPodJobResolver` implements `PodJobResolver` over the demo's pod and
  job objects with the ingest's own owner-chain walk.

Everything after these two interfaces — authorisation, validation,
idempotency, the store — is the real ingest path.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from dynamiccl import constants as c
from dynamiccl.api.rewards import JobRef
from dynamiccl.operator.ingest.auth import Caller, caller_from_review, job_from_owner_chain


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenIssuer:
    """Signs pod-bound ServiceAccount tokens (HS256 JWTs) with a per-demo secret."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock

    def sign(self, payload: Mapping[str, Any]) -> str:
        """A JWT of `payload` signed with the secret."""
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = _b64(json.dumps(dict(payload), sort_keys=True).encode())
        mac = hmac.new(self._secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64(mac)}"

    def issue(  # noqa: PLR0917 - the token's claims
        self,
        namespace: str,
        service_account: str,
        pod_name: str,
        pod_uid: str,
        audience: str = c.INGEST_AUDIENCE,
        ttl_s: float = 3600.0,
    ) -> str:
        """A token as the kubelet projects it into a pod (claims as Kubernetes writes them)."""
        now = self._clock()
        return self.sign(
            {
                "aud": [audience],
                "exp": int(now + ttl_s),
                "iat": int(now),
                "sub": f"system:serviceaccount:{namespace}:{service_account}",
                "kubernetes.io": {
                    "namespace": namespace,
                    "serviceaccount": {"name": service_account},
                    "pod": {"name": pod_name, "uid": pod_uid},
                },
            }
        )

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of a token this issuer signed, or None (bad shape or signature)."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        want = hmac.new(self._secret, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            ok = hmac.compare_digest(want, _unb64(parts[2]))
            claims = json.loads(_unb64(parts[1])) if ok else None
        except (ValueError, UnicodeDecodeError):
            return None
        return claims if isinstance(claims, dict) else None


class LocalTokenReviewer:
    """`TokenReviewer` without an API server: the issuer's signature, audience and expiry."""

    def __init__(self, issuer: TokenIssuer, clock: Callable[[], float] = time.time) -> None:
        self._issuer = issuer
        self._clock = clock
        self.reviews = 0

    async def review(self, token: str, audience: str) -> Caller | None:
        """The caller as a TokenReview would name it, or None when not authenticated."""
        self.reviews += 1
        claims = self._issuer.verify(token)
        if claims is None:
            return None
        aud = claims.get("aud")
        if not isinstance(aud, list) or audience not in aud:
            return None
        exp = claims.get("exp")
        if not isinstance(exp, int) or exp <= self._clock():
            return None
        pod = (claims.get("kubernetes.io") or {}).get("pod") or {}
        extra = {
            c.TOKENREVIEW_EXTRA_POD_NAME: [str(pod.get("name", ""))],
            c.TOKENREVIEW_EXTRA_POD_UID: [str(pod.get("uid", ""))],
        }
        return caller_from_review(str(claims.get("sub", "")), extra)


class LocalPodJobResolver:
    """`PodJobResolver` over the demo's objects (pods are added as the demo creates them)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], Mapping[str, Any]] = {}

    def add_pod(self, pod: Mapping[str, Any]) -> None:
        """Register a pod the demo created."""
        meta = pod["metadata"]
        self._pods[(str(meta["namespace"]), str(meta["name"]))] = pod

    def remove_pod(self, namespace: str, name: str) -> None:
        """Forget a pod (deleted with its job)."""
        self._pods.pop((namespace, name), None)

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        """The job owning the pod, or None if the pod is gone or has another uid."""
        pod = self._pods.get((namespace, pod_name))
        if pod is None or (pod.get("metadata") or {}).get("uid") != pod_uid:
            return None
        return job_from_owner_chain(namespace, pod, lambda *_: None, frozenset())

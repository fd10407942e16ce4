"""One learning loop among N ingest replicas: a `coordination.k8s.io/v1` Lease.

Every ingest replica stores rewards (exactly once: the idempotency key is the
store's primary key, operator/store/experience.py); only the replica holding
the Lease runs the learning loop and the retention pass. `LeaderElector.step()`
creates, renews or takes over the Lease; `held` says whether this replica may
act now.

Expiry is judged on this replica's own monotonic clock, never on the
`renewTime` another replica wrote (clocks of two nodes may disagree): a Lease
is expired when its record (resourceVersion) has not changed for
`leaseDurationSeconds` since this replica first saw it. A holder counts itself
the leader only until `renew_deadline_s` (2/3 of the duration by default) after
the start of its last successful write, so it stops before another replica can
take over. Every write carries the resourceVersion it read (the API server
refuses a stale one: `ConflictError`), so two replicas never both win one round.

Leadership only keeps one loop running at a time (liveness); each step of the
loop is safe to repeat (status merge patches, registrations by digest,
retraining Jobs checked by label before one is created).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dynamiccl.operator.kube import ConflictError, NotFoundError, Patcher, Resource

log = logging.getLogger("dynamiccl.operator.learning.leader")

LEASES: Final = Resource("coordination.k8s.io", "v1", "leases")
DEFAULT_DURATION_S: Final = 15.0


class LeaseAPI(Patcher, Protocol):
    """What the elector needs of the Kubernetes adapter (operator/kube.py `Kube`): a merge
    patch (`Patcher`), get and create."""

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]: ...


def micro_time(unix_s: float) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Observed:
    """The Lease as last read: its version, holder, and when this replica saw it change."""

    version: str
    holder: str
    duration_s: float
    transitions: int
    seen_at: float  # this replica's monotonic clock


def decide(obs: Observed | None, me: str, now: float) -> str:
    """What to do with the Lease: `create` (none), `renew` (ours), `take` (free or expired)
    or `follow` (another replica holds it). `now` is this replica's monotonic clock."""
    if obs is None:
        return "create"
    if obs.holder == me:
        return "renew"
    if not obs.holder or now - obs.seen_at >= obs.duration_s:
        return "take"
    return "follow"


class LeaderElector:
    """One replica's candidate for the Lease `namespace/name`."""

    def __init__(
        self,
        api: LeaseAPI,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration_s: float = DEFAULT_DURATION_S,
        renew_deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not identity:
            raise ValueError("a leader candidate needs an identity (its pod name)")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_s = duration_s
        self.renew_deadline_s = renew_deadline_s or duration_s * 2 / 3
        self.retry_s = duration_s / 5  # how often `step` should be called
        self._clock = clock
        self._wall = wall
        self._obs: Observed | None = None
        self._valid_until = 0.0

    @property
    def held(self) -> bool:
        """True while this replica may act as the leader (no I/O)."""
        return self._clock() < self._valid_until

    def _observe(self, obj: Mapping[str, Any]) -> Observed:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        version = str(meta.get("resourceVersion", ""))
        prev = self._obs
        changed = prev is None or prev.version != version
        obs = Observed(
            version=version,
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=float(spec.get("leaseDurationSeconds") or self.duration_s),
            transitions=int(spec.get("leaseTransitions") or 0),
            seen_at=self._clock() if changed or prev is None else prev.seen_at,
        )
        self._obs = obs
        return obs

    def _spec(self, transitions: int, *, acquire: bool) -> dict[str, Any]:
        now = micro_time(self._wall())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration_s)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = now
        return spec

    def step(self) -> bool:
        """Read the Lease, then create, renew or take it when this replica may; True when
        this replica leads now. API errors other than a lost race propagate (the caller
        retries; `held` runs out on its own)."""
        try:
            obs: Observed | None = self._observe(self.api.get(LEASES, self.name, self.namespace))
        except NotFoundError:
            obs = None
        t0 = self._clock()
        action = decide(obs, self.identity, t0)
        if action == "follow":
            self._valid_until = 0.0
            return False
        try:
            if obs is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(0, acquire=True),
                }
                written = self.api.create(LEASES, body)
            else:
                taking = action == "take"
                spec = self._spec(obs.transitions + taking, acquire=taking)
                patch = {"metadata": {"resourceVersion": obs.version}, "spec": spec}
                written = self.api.patch(LEASES, self.name, patch, self.namespace)
        except ConflictError:  # another replica wrote first: read again next step
            self._valid_until = 0.0
            return False
        self._observe(written)
        if action != "renew":
            log.info("learning loop leader: %s took lease %s", self.identity, self.name)
        self._valid_until = t0 + self.renew_deadline_s
        return True

    def release(self) -> None:
        """Give the Lease up (clean shutdown) so another replica takes over at once."""
        if not self.held or self._obs is None:
            return
        self._valid_until = 0.0
        patch = {
            "metadata": {"resourceVersion": self._obs.version},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1},
        }
        try:
            self.api.patch(LEASES, self.name, patch, self.namespace)
        except (ConflictError, NotFoundError):
            return

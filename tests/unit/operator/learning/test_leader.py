"""The learning loop's leader election among ingest replicas (operator/learning/leader.py).

The API server is `dynamiccl.testing.memory_api.MemoryAPI` (the one stand-in; its rule: a
stale resourceVersion is refused with 409). Each replica has its own clock.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from dynamiccl.operator.kube import NotFoundError
from dynamiccl.operator.learning.leader import LEASES, LeaderElector
from dynamiccl.testing.memory_api import MemoryAPI


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _elector(api: MemoryAPI, who: str, clock: Clock, **kw: Any) -> LeaderElector:
    return LeaderElector(api, "dyn", "learning", who, duration_s=15.0, clock=clock, **kw)


def test_one_replica_leads_the_other_follows_while_it_renews() -> None:
    api, ca, cb = MemoryAPI(), Clock(), Clock(5_000.0)  # unrelated clocks
    a, b = _elector(api, "ingest-a", ca), _elector(api, "ingest-b", cb)
    assert a.step()
    assert a.held
    for _ in range(20):  # A renews every 3 s; B never gets it
        ca.t += 3
        cb.t += 3
        assert a.step()
        assert not b.step()
        assert not b.held
    lease = api.get(LEASES, "learning", "dyn")["spec"]
    assert lease["holderIdentity"] == "ingest-a"
    assert lease["leaseTransitions"] == 0


def test_takeover_waits_the_lease_duration_on_the_followers_clock() -> None:
    api, ca, cb = MemoryAPI(), Clock(), Clock()
    a, b = _elector(api, "ingest-a", ca), _elector(api, "ingest-b", cb)
    assert a.step()
    assert not b.step()  # B sees the record now
    # A stops (killed): B takes over only once the record has not changed for 15 s
    cb.t += 14.9
    ca.t += 14.9
    assert not b.step()
    assert not a.held  # A's own deadline (10 s after its write) passed before that
    cb.t += 0.1
    assert b.step()
    assert b.held
    spec = api.get(LEASES, "learning", "dyn")["spec"]
    assert spec["holderIdentity"] == "ingest-b"
    assert spec["leaseTransitions"] == 1


def test_a_holders_skewed_wall_clock_does_not_hand_the_lease_over() -> None:
    """A's renewTime says a year ago (its node's clock): B judges by the record changing."""
    api, ca, cb = MemoryAPI(), Clock(), Clock()
    a = _elector(api, "ingest-a", ca, wall=lambda: 1_600_000_000.0)
    b = _elector(api, "ingest-b", cb)
    assert a.step()
    for _ in range(10):
        ca.t += 3
        cb.t += 3
        assert a.step()
        assert not b.step()


def test_two_replicas_racing_for_an_expired_lease_one_wins() -> None:
    api, ca, cb, cc = MemoryAPI(), Clock(), Clock(), Clock()
    a, b, c = (_elector(api, w, k) for w, k in (("a", ca), ("b", cb), ("c", cc)))
    assert a.step()
    assert not b.step()
    assert not c.step()
    for k in (ca, cb, cc):
        k.t += 20
    # b and c both read the expired lease before either writes
    real_get = api.get
    snapshot = real_get(LEASES, "learning", "dyn")
    api.get = lambda *_a, **_k: copy.deepcopy(snapshot)  # type: ignore[method-assign]
    won = [b.step(), c.step()]
    api.get = real_get  # type: ignore[method-assign]
    assert sorted(won) == [False, True]
    assert b.held != c.held


def test_release_hands_over_at_once() -> None:
    api, ca, cb = MemoryAPI(), Clock(), Clock()
    a, b = _elector(api, "ingest-a", ca), _elector(api, "ingest-b", cb)
    assert a.step()
    assert not b.step()
    a.release()
    assert not a.held
    assert b.step()


def test_create_race_is_a_lost_round_not_an_error() -> None:
    api, ca, cb = MemoryAPI(), Clock(), Clock()
    a, b = _elector(api, "a", ca), _elector(api, "b", cb)
    real_get = api.get

    def absent(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise NotFoundError("learning")

    api.get = absent  # type: ignore[method-assign]
    assert a.step()
    assert not b.step()  # its create finds A's Lease: 409
    api.get = real_get  # type: ignore[method-assign]
    assert a.held
    assert not b.held


@pytest.mark.parametrize("seed", range(8))
def test_never_two_leaders_with_pauses_and_kills(seed: int) -> None:
    """Three replicas step in random order on one timeline, some pause for a while (a
    stalled process): at no instant do two of them count themselves the leader, and
    someone leads again within two lease durations of the leader going quiet."""
    rng = random.Random(seed)
    api = MemoryAPI()
    clock = Clock()
    names = ["a", "b", "c"]
    es = {n: _elector(api, n, clock) for n in names}
    paused_until = dict.fromkeys(names, 0.0)
    last_led = clock.t
    for _ in range(3000):
        clock.t += rng.uniform(0.1, 1.5)
        n = rng.choice(names)
        if rng.random() < 0.01:
            paused_until[n] = clock.t + rng.uniform(5, 40)
        if clock.t >= paused_until[n]:
            es[n].step()
        leaders = [m for m in names if es[m].held]
        assert len(leaders) <= 1, (seed, clock.t, leaders)
        if leaders:
            last_led = clock.t
        everyone_awake = all(clock.t >= p for p in paused_until.values())
        if everyone_awake:
            assert clock.t - last_led < 2 * 15.0 + 45, (seed, clock.t)


def test_identity_is_required() -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(MemoryAPI(), "dyn", "learning", "")

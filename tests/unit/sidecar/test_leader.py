"""The proposer lease on the file CAS backend."""

from __future__ import annotations

import json
from pathlib import Path

from dynamiccl.sidecar.cas import FileCAS
from dynamiccl.sidecar.leader import Lease


def test_one_holder_renewal_and_takeover_after_expiry(tmp_path: Path) -> None:
    store = FileCAS(tmp_path / "lease.json")
    now = [1000.0]
    a = Lease(store, "a", duration_s=10, clock=lambda: now[0])
    b = Lease(store, "b", duration_s=10, clock=lambda: now[0])
    assert a.step()
    assert not b.step()
    assert (a.held, b.held) == (True, False)
    v0 = store.read()[1]
    now[0] += 3
    assert a.step()
    assert store.read()[1] == v0  # renewed recently: no write
    now[0] += 4  # past half the duration: renews
    assert a.step()
    assert store.read()[1] == v0 + 1
    now[0] += 9
    assert not b.step()  # a's renewal still holds
    now[0] += 2
    assert b.step()  # expired: taken over
    assert not a.step()
    assert (a.held, a.current()[0]) == (False, "b")


def test_release_lets_another_take_over_at_once(tmp_path: Path) -> None:
    store = FileCAS(tmp_path / "lease.json")
    a, b = Lease(store, "a"), Lease(store, "b")
    assert a.step()
    assert not b.step()
    b.release()  # not the holder: nothing happens
    assert not b.step()
    a.release()
    assert b.step()


def test_a_garbled_record_counts_as_free(tmp_path: Path) -> None:
    store = FileCAS(tmp_path / "lease.json")
    assert store.cas(0, "not json")
    lease = Lease(store, "a")
    assert lease.current()[0] is None
    assert lease.step()
    assert json.loads(store.read()[0] or "")["holder"] == "a"


def test_only_one_of_many_contenders_wins(tmp_path: Path) -> None:
    store = FileCAS(tmp_path / "lease.json")
    leases = [Lease(store, f"s{i}") for i in range(8)]
    assert sum(lease.step() for lease in leases) == 1
    assert sum(lease.step() for lease in leases) == 1

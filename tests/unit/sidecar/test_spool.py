"""The spool's crash consistency: every interruption point of a cut and of an acknowledgement."""

from __future__ import annotations

import json
from pathlib import Path

from dynamiccl.sidecar.spool import Spool, SpoolState


def test_state_round_trips_and_another_pods_state_is_ignored(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "uid-a")
    st = SpoolState("uid-a", next_seq=5, cursors={0: 10, 3: 7}, aggregator={"x": 1}, baseline=[1])
    sp.save(st)
    got = sp.load()
    assert (got.next_seq, got.cursors, got.aggregator, got.baseline) == (
        5,
        {0: 10, 3: 7},
        {"x": 1},
        [1],
    )
    assert not got.recovered_cut
    other = Spool(tmp_path, "uid-b").load()
    assert (other.next_seq, other.cursors) == (1, {})


def test_a_cut_interrupted_after_its_batch_drops_the_aggregates_it_holds(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "u")
    sp.save(SpoolState("u", next_seq=3, aggregator={"stats": [1]}))
    sp.put_batch(3, b"{}")  # step 2a done, 2b (state) not
    st = sp.load()
    assert (st.next_seq, st.aggregator, st.recovered_cut) == (4, {}, True)
    sp.save(st)
    again = sp.load()  # idempotent once saved
    assert (again.next_seq, again.recovered_cut) == (4, False)


def test_a_cut_whose_batch_was_already_sent_is_recovered_too(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "u")
    sp.save(SpoolState("u", next_seq=3, aggregator={"stats": [1]}))
    sp.put_batch(3, b"{}")
    sp.ack(3, calls=10, records=1)  # the sender was faster than the state write
    assert sp.outbox() == []
    st = sp.load()
    assert (st.next_seq, st.aggregator) == (4, {})


def test_acks_count_once_and_remove_the_batch(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "u")
    for s in (1, 2):
        sp.put_batch(s, json.dumps({"s": s}).encode())
    assert sp.outbox() == [1, 2]
    assert sp.read_batch(2) == b'{"s": 2}'
    sp.ack(1, 5, 2)
    sp.ack(1, 5, 2)  # acknowledged again (killed between the count and the removal)
    tot = sp.ack(2, 7, 1)
    assert (tot.batches, tot.calls, tot.records) == (2, 12, 3)
    assert sp.outbox() == []
    assert sp.read_batch(1) is None
    assert Spool(tmp_path, "u").sent().calls == 12
    assert Spool(tmp_path, "other").sent().calls == 0


def test_rejected_batches_leave_the_outbox_with_their_reason(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "u")
    sp.put_batch(9, b"{}")
    sp.reject(9, "422 bad")
    assert sp.outbox() == []
    assert (tmp_path / "rejected" / f"{9:016d}.reason").read_text() == "422 bad"
    sp.reject(9, "again")  # gone already: no error


def test_garbage_files_do_not_break_loading(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "u")
    (tmp_path / "state.json").write_text("{not json")
    (tmp_path / "sent.json").write_text("[]")
    (tmp_path / "outbox" / "junk.json").write_text("x")
    st = sp.load()
    assert st.next_seq == 1
    assert sp.sent().batches == 0
    assert sp.outbox() == []

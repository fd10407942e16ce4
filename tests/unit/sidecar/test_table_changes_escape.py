"""The sidecar leaves a committed configuration measured far behind a look without waiting
for the round (`Tuning.escape_due`, `Coordination._escape_due`): the next table goes out
after `escape_interval_s`, not `min_interval_s`, and carries the faster configuration.

Sidecars agreeing through the epoch record (file CAS, real shared-memory files), as in
test_table_changes.py, whose pods and fake clock these tests use.
"""

from __future__ import annotations

import random

from dynamiccl.api.epoch import EpochStatus
from dynamiccl.sidecar.tuning import Tuning
from tests.unit.sidecar.test_table_changes import L, Pod, pods, record, step

__all__ = ["pods"]  # the fixture

RING_LL128, RING_SIMPLE = (1, 1, 0, 0), (1, 2, 0, 0)


def _started(pods: list[Pod]) -> Pod:
    """Both pods run with the initial table committed; the leader."""
    for p in pods:
        p.tuning.rounds = True  # the sidecar's setting
        p.process_at(L)
    step(pods, 6)
    assert len(record(pods[0]).epochs) == 1  # type: ignore[attr-defined]
    return next(p for p in pods if p.coord.leader)


def _measure(t: Tuning, committed_us: float, look_us: float) -> None:
    """Four calls of the table's first choice (Ring/LL128) and one look at Ring/Simple in
    the 1 MiB all-reduce cell."""
    rng = random.Random(4)
    sc = t.base.scales[0]  # type: ignore[union-attr]
    for arm, us in ((RING_LL128, committed_us),) * 4 + ((RING_SIMPLE, look_us),):
        t.observe(sc, 4, 20, 8, 2, arm, us * rng.lognormvariate(0, 0.01))


def _first_choice(p: Pod) -> tuple[str, str]:
    latest = p.coord.history.latest
    assert latest is not None
    t = latest.table
    cell = t.cell(t.cells[0].collective, 20, t.scales[0])
    assert cell is not None
    return cell.choices[0].algo.value, cell.choices[0].proto.value


def test_a_committed_choice_three_times_slower_than_a_look_is_left_within_seconds(
    pods: list[Pod],
) -> None:
    leader = _started(pods)
    _measure(leader.tuning, committed_us=90.0, look_us=30.0)
    assert leader.tuning.escape_due()
    leader.now[0] += leader.coord.s.escape_interval_s  # 5 s, far short of the 30 s round
    step(pods, 4)
    eps = record(pods[0]).epochs  # type: ignore[attr-defined]
    assert [e.status for e in eps] == [EpochStatus.COMMITTED] * 2
    assert _first_choice(pods[0]) == ("ring", "simple")
    assert not leader.tuning.escape_due()  # the fold moved the cell; nothing more to escape


def test_a_look_within_the_noise_waits_for_the_round(pods: list[Pod]) -> None:
    leader = _started(pods)
    _measure(leader.tuning, committed_us=30.0, look_us=29.0)
    assert not leader.tuning.escape_due()
    leader.now[0] += leader.coord.s.escape_interval_s
    step(pods, 4)
    assert len(record(pods[0]).epochs) == 1  # type: ignore[attr-defined]  # the round waits
    assert _first_choice(pods[0]) == ("ring", "ll128")


def test_an_escape_waits_for_the_escape_interval_after_the_last_proposal(
    pods: list[Pod],
) -> None:
    leader = _started(pods)
    _measure(leader.tuning, committed_us=90.0, look_us=30.0)
    step(pods, 2)  # the initial table went out less than escape_interval_s ago
    assert len(record(pods[0]).epochs) == 1  # type: ignore[attr-defined]
    assert leader.tuning.escape_due()  # still due: nothing folded it


def test_an_early_round_folds_only_the_escaping_cell_and_scales_its_next_round(
    pods: list[Pod],
) -> None:
    """The other cells keep their round; the escaping cell's five calls count as a full
    interval's toward its next round's scale (the round it plans runs the full interval:
    at five calls' scale a busy cell would explore several epochs' looks in it)."""
    leader = _started(pods)
    t = leader.tuning
    _measure(t, committed_us=90.0, look_us=30.0)  # the 1 MiB cell (bucket 20)
    sc = t.base.scales[0]  # type: ignore[union-attr]
    for _ in range(40):  # the 16 MiB cell (bucket 24): a full epoch, nothing to escape
        t.observe(sc, 4, 24, 8, 2, RING_LL128, 30.0)
    leader.now[0] += leader.coord.s.escape_interval_s
    step(pods, 4)
    assert len(record(pods[0]).epochs) == 2  # type: ignore[attr-defined]
    cells = {cid[2]: ct for cid, ct in t.cells.items()}
    assert cells[20].tuner.epoch == 1  # folded early
    assert (cells[24].tuner.epoch, cells[24].since_epoch) == (0, 40)  # waits for its round
    assert 5 < cells[20].round_calls <= 30  # 5 calls, stretched to the 30 s interval

"""One detector per process slot, explored steps told apart (sidecar/step_watch.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable
from dynamiccl.sidecar.attribution import History
from dynamiccl.sidecar.step_judge import StepJudge, Vetoes
from dynamiccl.sidecar.step_watch import HOLD_MAX_STEPS, StepWatch
from dynamiccl.sidecar.steps import Status, Step
from tests import step_workloads as sw


def test_a_new_owner_of_a_slot_gets_a_new_detector() -> None:
    w = StepWatch(StepJudge(Vetoes()))
    first = w.detector(0, 100)
    assert w.detector(0, 100) is first
    assert w.detector(0, 101) is not first  # the process restarted
    assert w.status is Status.LEARNING


def test_a_step_holding_an_explored_call_of_its_communicator_counts_as_explored() -> None:
    w = StepWatch(StepJudge(Vetoes()))
    w.detector(0, 1)
    w.explored(0, 7, 30)  # another communicator: not this step's
    w.explored(0, 5, 50)
    h = History()
    w.add(0, Step(5, 24, 0, 10_000_000, 24), h)  # calls 24..47: clean
    w.add(0, Step(5, 48, 0, 11_000_000, 24), h)  # calls 48..71: call 50 explored
    s = w.judge.version_steps(0)
    assert s is not None
    assert (s.count, s.explored) == (2, 1)
    assert w.judge.exploration_cost() == (11_000 - 10_000) / 21_000


def _finding_table() -> DecisionTable:
    cell = Cell(
        collective=Collective.ALLREDUCE,
        bucket=24,
        scale=3,
        choices=(Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=32),),
    )
    return DecisionTable(version=1, scales=(3,), cells=(cell,))


def _until_released(w: sw.Workload, table: DecisionTable) -> tuple[StepWatch, int | None]:
    """The records one by one into a watch, the proposer asking after each whether the
    first table waits (every step is NCCL's: no epoch yet); the call it stopped waiting."""
    watch, h = StepWatch(StepJudge(Vetoes())), History()
    det = watch.detector(0, 1)
    for i, r in enumerate(w.records):
        for step in det.observe_block(*([x] for x in r)):
            watch.add(0, step, h)
        if not watch.holds_first_table(table):
            if watch.found_once:
                return watch, i
            assert watch.held  # nothing found yet: asked again later
    return watch, None


@pytest.mark.parametrize(
    "make", [sw.ddp, sw.fsdp, lambda: sw.one_f_one_b(stage=0)], ids=["ddp", "fsdp", "1f1b"]
)
def test_the_first_table_waits_for_nccls_steps_of_the_whole_step(
    make: Callable[[], sw.Workload],
) -> None:
    """The job's first table (a finding's choice) goes out once NCCL's own steps were
    measured at the step's real period (not the warm-up's broadcasts, not a part of the
    step whose calls repeat), within the budget: the judge can then compare the two."""
    w = make()
    watch, released = _until_released(w, _finding_table())
    assert released is not None
    nccl = watch.judge.nccl_steps()
    assert nccl is not None
    (det,) = (d for _, d in watch.detectors.values())
    assert nccl.period == len(w.per_step[det.clock or 0])  # the whole step
    assert len(nccl.times) >= watch.judge.min_steps
    assert nccl.count <= HOLD_MAX_STEPS
    assert not watch.holds_first_table(_finding_table())  # once per sidecar


def test_no_wait_without_a_committed_choice_or_a_step() -> None:
    nothing = _finding_table().model_copy(
        update={"cells": (_finding_table().cells[0].model_copy(update={"choices": ()}),)}
    )
    watch, released = _until_released(sw.ddp(steps=20), nothing)
    assert released is None  # NCCL decides everywhere: nothing to judge, never waits
    watch, released = _until_released(sw.random_calls(calls=5000), _finding_table())
    assert released is None  # never a step: never waited
    assert watch.status is Status.NONE
    assert not watch.found_once

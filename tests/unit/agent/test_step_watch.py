"""One detector per process slot, explored steps told apart (agent/step_watch.py)."""

from __future__ import annotations

from dynamiccl.agent.attribution import History
from dynamiccl.agent.step_judge import StepJudge, Vetoes
from dynamiccl.agent.step_watch import StepWatch
from dynamiccl.agent.steps import Status, Step


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

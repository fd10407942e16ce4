"""The sidecar's training steps: one detector per process, one judge per pod (issue 31).

Each process of the pod writes its own profiler ring (a slot of the shared
memory); `StepWatch.detector` keeps one `StepDetector` (sidecar/steps.py) per slot
and starts a new one when the slot's owner changes (a restarted process). The
steps every process finds go to one `StepJudge` (sidecar/step_judge.py), which
credits them to the table in effect and judges the tuner's changes.

`status`: "found" while some process's detector has a clock, "none" once every
detector that saw enough calls says so (no repeating pattern: the tuner's
changes are then kept on kernel time alone, as without the judge), else
"learning".

The job's first table waits for NCCL's steps (`holds_first_table`): its committed
choices (a model's, or a cluster finding's: docs/learning-loop.md) are a change
from NCCL's own choices like any other, and the judge compares them with the steps
before the first epoch (version 0). So once some detector found a step, while the
first table has a committed choice and no settled clock (its period found again by
a later search) has `min_steps` steps of NCCL's own choices at its period, the
proposer waits: at most until `HOLD_MAX_STEPS` steps of NCCL's choices were measured,
a process made `HOLD_MAX_CALLS` calls, or the detectors say no step; once per
sidecar. A job whose detectors never found a step does not wait. Cost: steps at
NCCL's choices instead of the table's, at most `HOLD_MAX_STEPS` (usually the
detector's settling and `min_steps`), only where the epoch protocol's own start
(the processes' first interval and the lead) left fewer.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl.api.rewards import StepStatus, StepTimes
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.attribution import History
from dynamiccl.sidecar.step_judge import StepJudge, Verdict
from dynamiccl.sidecar.steps import Status, Step, StepDetector

EXPLORED_KEPT: Final = 1024  # explored calls' sequence numbers kept per slot
HOLD_MAX_STEPS: Final = 32  # NCCL's steps the first table waits for, at most
HOLD_MAX_CALLS: Final = 4096  # a process's calls the first table waits for, at most


@dataclass
class StepWatch:
    """Per slot, its owner and its detector; the pod's judge."""

    judge: StepJudge
    detectors: dict[int, tuple[int, StepDetector]] = field(default_factory=dict)
    # per slot: (communicator, sequence number) of its explored calls, in arrival order
    explored_calls: dict[int, deque[tuple[int, int]]] = field(default_factory=dict)
    held: bool = True  # the first table may still wait (`holds_first_table`)
    found_once: bool = False  # some process's detector had a clock

    def detector(self, slot: int, owner: int) -> StepDetector:
        got = self.detectors.get(slot)
        if got is None or got[0] != owner:
            got = self.detectors[slot] = (owner, StepDetector())
            self.explored_calls.pop(slot, None)
        return got[1]

    def explored(self, slot: int, comm_id: int, coll_seq: int) -> None:
        """A call of process `slot` explored (its origin is `explore`)."""
        got = self.explored_calls.get(slot)
        if got is None:
            got = self.explored_calls[slot] = deque(maxlen=EXPLORED_KEPT)
        got.append((comm_id, coll_seq))

    def add(self, slot: int, step: Step, history: History) -> None:
        """A step of process `slot`: to the judge, with whether one of its calls explored."""
        got = self.explored_calls.get(slot)
        hit = False
        if got:
            calls = sorted(s for c, s in got if c == step.comm_id)
            i = bisect.bisect_left(calls, step.coll_seq)
            hit = i < len(calls) and calls[i] < step.coll_seq + step.calls
        self.judge.add(step, history, hit)

    def holds_first_table(self, table: DecisionTable | None) -> bool:
        """Whether the job's first table waits for NCCL's steps (module docstring)."""
        if not self.held or table is None or not any(c.choices for c in table.cells):
            return False
        dets = [d for _, d in self.detectors.values()]
        self.found_once |= any(d.status is Status.FOUND for d in dets)
        if not self.found_once:
            return False  # no step (yet): no wait, and asked again if the table did not go out
        nccl = self.judge.nccl_steps()
        measured = any(
            d.settled
            and nccl is not None
            and nccl.period == d.period
            and len(nccl.times) >= self.judge.min_steps
            for d in dets
        )
        self.held = (
            self.status is not Status.NONE
            and not measured
            and (nccl is None or nccl.count < HOLD_MAX_STEPS)
            and max(d.calls for d in dets) < HOLD_MAX_CALLS
        )
        return self.held

    def check(self) -> list[Verdict]:
        return self.judge.check()

    @property
    def status(self) -> Status:
        states = {d.status for _, d in self.detectors.values()}
        if Status.FOUND in states:
            return Status.FOUND
        return Status.NONE if states == {Status.NONE} else Status.LEARNING

    def times(self, version: int) -> StepTimes:
        """What a reward batch of table `version` carries about the step."""
        status = StepStatus(self.status.value)
        got = self.judge.version_steps(version)
        if got is None or not got.times or status is not StepStatus.FOUND:
            return StepTimes(status=status)
        return StepTimes(
            status=status, steps=got.count, median_us=got.median(), spread_us=got.spread(),
            period=got.period or None,
        )  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """For the sidecar's --json report: the step status, the judge's figures, and each
        process's detector (by slot)."""
        status = self.status
        return {
            "status": status.value,
            "judged_by": "step time" if status is Status.FOUND else "kernel time",
            **self.judge.summary(),
            "processes": {str(s): d.summary() for s, (_, d) in sorted(self.detectors.items())},
        }

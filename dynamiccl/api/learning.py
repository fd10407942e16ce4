"""What the learning loop knows, as the NCCLTuningPolicy's `status.learning` shows it.

Three parts, all written by the learning loop (operator/learning/learning_status.py):

- `rollout`: the registry's promoted and canary model versions and the canary
  share, which the operator hands new jobs (unless the policy's spec pins a version);
- `retrain`: the rows the newest retrained model learned from and the rows it
  could not use, by reason (policy/train/store_data.py);
- `hardwareClasses`: per hardware class (the env-knob cohort: GPU, node, NICs,
  fabric; not the scale), what real measurements say about each cell
  (communicator shape x collective x size bucket): every configuration measured
  there with its calls, jobs and speedup over NCCL's own choice in that cell.
  A cell is *settled* when measurements decide it: NCCL's own choice is
  measured (`MIN_CALLS` calls) and at least `SETTLE_CONFIGS - 1` alternatives
  are decided (`MIN_CALLS` calls each, or ruled out: `RULED_OUT_CALLS` calls
  clearly slower, which is also when job tables stop exploring them), or a
  departure is found. A *departure* is a configuration measured at
  least `1 + DEPARTURE_MARGIN` times faster than NCCL's own; it is *adopted*
  once jobs run it as their table's choice (not as exploration). A departure
  settles its cell only once it is a *finding*;
- `findings` (issue 29): per cell, a configuration that each of several
  independent jobs measured faster than NCCL's own choice in that job, beyond
  the noise (`confirm` in `Finding`): it *holds* once `exploration.confirmJobs`
  jobs from `exploration.confirmNamespaces` namespaces (fewer where the class has
  jobs in fewer) support it and none of the latest as many contradicts it. Every
  new job of the class then starts with it in that cell, whatever its model
  version (policy/runtime/measured.py); one job's word never makes one.

The operator reads a job's hardware class from here when it compiles the job's
table (policy/runtime/exploration.py): settled cells are not explored again,
measured candidates are not measured again, the rest is shared out between jobs.
Confidence thus comes from measurements, never from the simulator.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

from dynamiccl.api.k8s import CamelModel

MIN_CALLS: Final = 16  # calls of a configuration in a cell before it counts as measured
SETTLE_CONFIGS: Final = 3  # NCCL's own + 2 alternatives measured: the cell is settled
DEPARTURE_MARGIN: Final = 0.05  # measured >= 5 % faster than NCCL's own: a departure
RULED_OUT_CALLS: Final = 4  # ... or this many at less than RULED_OUT_SPEEDUP: ruled out
RULED_OUT_SPEEDUP: Final = 0.67
MAX_CLASSES: Final = 16
MAX_CELLS: Final = 400
MAX_MEASURED: Final = 8
MAX_DEPARTURES: Final = 32
MAX_FINDINGS: Final = 128
FINDING_Z: Final = 3.0  # a job's speedup counts beyond this many standard errors of its noise

Count = Annotated[int, Field(ge=0)]
ConfigKey = tuple[str, str, int, int]  # (algo, proto, nchannels, chunk bytes): `Config.key`


class Config(CamelModel):
    """One configuration (NCCL names; 0 channels / chunk = NCCL's own)."""

    algo: Annotated[str, Field(max_length=32)]
    proto: Annotated[str, Field(max_length=16)]
    nchannels: Annotated[int, Field(ge=0, le=255)] = 0
    chunk_bytes: Annotated[int, Field(ge=0)] = 0

    @property
    def key(self) -> ConfigKey:
        return (self.algo, self.proto, self.nchannels, self.chunk_bytes)


class MeasuredConfig(Config):
    """A configuration measured in a cell, over every job of the class."""

    calls: Count = 0
    jobs: Count = 0
    speedup: Annotated[float, Field(ge=0.0)] = 0.0  # NCCL's own time / this one's
    nccl_own: bool = False  # measured as NCCL's own decision (the plugin left the call alone)
    as_table: Count = 0  # calls that ran it as the table's choice (not exploration)

    @property
    def decided(self) -> bool:
        """Measured enough that no job needs to try it again: `MIN_CALLS` calls, or
        `RULED_OUT_CALLS` calls at less than `RULED_OUT_SPEEDUP` of NCCL's own speed."""
        return self.calls >= MIN_CALLS or (
            self.calls >= RULED_OUT_CALLS and 0 < self.speedup < RULED_OUT_SPEEDUP
        )

    @property
    def is_departure(self) -> bool:
        """Not NCCL's own, measured (`MIN_CALLS` calls) and at least `1 + DEPARTURE_MARGIN`
        times faster than NCCL's own."""
        return (
            self.calls >= MIN_CALLS and not self.nccl_own and self.speedup >= 1 + DEPARTURE_MARGIN
        )


class CellKey(CamelModel):
    """A cell of a hardware class: communicator shape, collective, size bucket."""

    collective: Annotated[str, Field(max_length=32)]
    size_bucket: Annotated[int, Field(ge=0, le=64)]
    nranks: Annotated[int, Field(ge=1)]
    nnodes: Annotated[int, Field(ge=1)]


class CellCoverage(CellKey):
    """What measurements say about one cell."""

    settled: bool = False
    measured: Annotated[list[MeasuredConfig], Field(max_length=MAX_MEASURED)] = Field(
        default_factory=list
    )

    def measured_keys(self) -> set[ConfigKey]:
        """Configurations measured enough: MIN_CALLS calls, or RULED_OUT_CALLS calls at less
        than RULED_OUT_SPEEDUP of NCCL's own speed (no job needs to try those again)."""
        return {m.key for m in self.measured if m.decided}


class Departure(CellKey, Config):
    """A configuration measured faster than NCCL's own choice."""

    speedup: Annotated[float, Field(ge=0.0)]
    calls: Count = 0
    jobs: Count = 0
    adopted: bool = False


class Finding(CellKey, Config):
    """A configuration measured faster than NCCL's own choice by several independent jobs.

    `supporting`: jobs whose own measurement (both arms in the job) put it at least
    `1 + DEPARTURE_MARGIN` times faster than NCCL's own, `FINDING_Z` standard errors
    clear of their noise; `contradicting`: jobs that measured it (and NCCL's own) and
    found it not that much faster, or whose guardrail reverted the cell while it ran
    it, or whose training step it made slower while it made the collectives faster
    (`stepSlower` of them: the learning loop does not learn that change). `holds`:
    enough supporting jobs and namespaces, no contradiction among the latest jobs that
    measured it: new jobs start with it (`measured` cells)."""

    speedup: Annotated[float, Field(ge=0.0)]  # geometric mean over the supporting jobs
    nccl_algo: Annotated[str, Field(max_length=32)] = ""  # NCCL's own pair in the cell
    nccl_proto: Annotated[str, Field(max_length=16)] = ""
    supporting: Count = 0
    namespaces: Count = 0  # of the supporting jobs
    contradicting: Count = 0
    step_slower: Count = 0  # of the contradicting: jobs whose training step it made slower
    holds: bool = False


class ClassCoverage(CamelModel):
    """One hardware class."""

    hardware_class: Annotated[str, Field(max_length=64)]
    jobs: Count = 0
    cells_measured: Count = 0
    cells_settled: Count = 0
    departures: Annotated[list[Departure], Field(max_length=MAX_DEPARTURES)] = Field(
        default_factory=list
    )
    cells: Annotated[list[CellCoverage], Field(max_length=MAX_CELLS)] = Field(default_factory=list)
    findings: Annotated[list[Finding], Field(max_length=MAX_FINDINGS)] = Field(default_factory=list)

    def holding(self) -> list[Finding]:
        """The findings every new job of the class starts with."""
        return [f for f in self.findings if f.holds]


class RetrainRows(CamelModel):
    """The experience rows the newest retrained model read, used and skipped (by reason)."""

    model_version: Annotated[str, Field(max_length=63)]
    rows_read: Count = 0
    rows_used: Count = 0
    rows_skipped: Annotated[dict[str, int], Field(max_length=16)] = Field(default_factory=dict)


class RolloutStatus(CamelModel):
    """The model versions of the loop's registry: what new jobs get unless the spec pins one."""

    promoted: Annotated[str, Field(max_length=63)] | None = None
    canary: Annotated[str, Field(max_length=63)] | None = None
    canary_percent: Annotated[int, Field(ge=0, le=100)] = 0


class LearningStatus(CamelModel):
    """`status.learning` of an NCCLTuningPolicy."""

    rollout: RolloutStatus = Field(default_factory=RolloutStatus)
    retrain: RetrainRows | None = None
    hardware_classes: Annotated[list[ClassCoverage], Field(max_length=MAX_CLASSES)] = Field(
        default_factory=list
    )
    experience_cursor: Count = 0  # the store id the coverage was computed up to

    def coverage(self, hardware_class: str) -> ClassCoverage | None:
        for c in self.hardware_classes:
            if c.hardware_class == hardware_class:
                return c
        return None

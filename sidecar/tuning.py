"""The online tuner of the policy package, run on the sidecar's measurements.

One `BucketTuner` (policy/online/tuner.py) per decision-table cell that the job's
table lets explore (mode ``learned``: the cell has candidates). The plugin's
table has no communicator dimension — communicators of the same shape share a
cell — so a tuner is keyed by the cell (scale class, collective, size bucket)
and fed by every communicator of that shape.

Arms are the cell's ranked choices, its candidates and NCCL's own pick (from
the NCCL model, `baseline.NcclDefaults`), in that order; the prior puts the
table's first choice (or, for a cell without choices, NCCL's pick) first
(sidecar/cell_arms.py).
A measured call is credited to the arm it ran (`attribution.classify`); calls
whose configuration is no arm of the cell are ignored here (they still are
rewards). With `rounds` (the sidecar's setting) the tuner folds its measurements into a
new plan once per table round (`end_round`, when the proposer may publish a table) for
every cell with `TunerConfig.epoch_calls` calls since its last fold; a round with more
calls explores only the epoch's expected calls (`plan.round_plan`). Without it, every
`epoch_calls` calls.

With `refine` > 0 and the policy's channel range (the sidecar's default,
`AgentConfig.tuner`), a cell's arms also hold every channel variant of the table arms'
(algorithm, protocol, chunk) within the policy's `constraints.channels` and the
communicator's channels, weighted below every table arm, and (`RaceConfig.probe_pairs`,
the policy's allowed algorithms and protocols) every other (algorithm, protocol) NCCL's
model offers for the shape, at NCCL's channels, below those, so a pair the table leaves
out gets one look. The race (`TunerConfig.race`, policy/online/race.py) walks each
pair's channel ladder from its middle and top rungs, never paying for a rung the walk
does not reach. `dynamiccl bench tune` builds its tuner with the same
`online.cell_tuner` and runs the same race.

`table(version)` renders the preferred table: the base table with each tuned
cell replaced by its plan (committed arm first, then the base cell's other
choices as fallbacks; NCCL's own pick as the committed arm means "no forcing").
`signature()` changes only when a plan's committed arm or its candidate set or
whether it explores changes: the proposer publishes a new table on such
changes (rate-limited, epochs are scarce), not on every weight update.
The tuner's state is not persisted: a restarted sidecar learns again from the
table in effect.

Step time has the last word (sidecar/step_judge.py): a committed choice the step judge
rejected (`Tuning.vetoes`) is banned in its cell's tuner at the next fold, never
rendered as the committed arm (the choice kept instead is) nor as a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from dynamiccl.api.nccl import collective_from_id
from dynamiccl.api.rewards import MAX_EVENTS_PER_BATCH, EventKind, TunerEvent
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
)
from dynamiccl.policy.online.plan import round_plan
from dynamiccl.policy.online.probes import probe_order
from dynamiccl.policy.online.tuner import (
    CellKey,
    TunerConfig,
    cell_tuner,
)
from dynamiccl.policy.runtime.actions import NCHANNEL_CHOICES
from dynamiccl.sidecar.attribution import Arm, arm_of, choice_of
from dynamiccl.sidecar.baseline import NcclDefaults
from dynamiccl.sidecar.cell_arms import CellId, CellTuner, cell_arms, cell_event, cell_id
from dynamiccl.sidecar.step_judge import Vetoes

MAX_PENDING_EVENTS: Final = 4 * MAX_EVENTS_PER_BATCH
_EVENT_KINDS: Final = {"guardrail": EventKind.GUARDRAIL_REVERT, "change": EventKind.CHANGE_DETECTED}


@dataclass
class Tuning:
    """All cell tuners of one sidecar."""

    base: DecisionTable | None
    cfg: TunerConfig
    defaults: NcclDefaults
    enabled: bool = True
    channel_range: tuple[int, int] | None = None  # constraints.channels; None: no variants
    allowed_pairs: frozenset[tuple[int, int]] | None = None  # (algo, proto) ids; None: no probes
    rounds: bool = False  # fold once per table round (`end_round`), not every epoch_calls calls
    cells: dict[CellId, CellTuner] = field(default_factory=dict)
    events: list[TunerEvent] = field(default_factory=list)
    dropped_events: int = 0
    vetoes: Vetoes = field(default_factory=Vetoes)  # choices step time rejected (step_judge.py)

    def __post_init__(self) -> None:
        self._base_cells: dict[CellId, Cell] = {}
        if self.base is not None:
            for c in self.base.cells:
                if c.candidates:
                    self._base_cells[cell_id(c)] = c

    def _tuner(self, cid: CellId, nranks: int, nnodes: int) -> CellTuner | None:
        ct = self.cells.get(cid)
        if ct is not None or not self.enabled or self.base is None:
            return ct
        cell = self._base_cells.get(cid)
        if cell is None:
            return None
        _scale, coll, bucket = cid
        key = CellKey(self.base.explore.seed, 0, nranks, nnodes, collective_from_id(coll), bucket)
        ct = self.cells[cid] = self._cell_tuner(cell, key)
        return ct

    def _with_variants(self, arms: list[Arm], prior: list[float], key: CellKey) -> None:
        """The race's arms: the table's and every channel variant of their (algo, proto,
        chunk) within the policy's channel range, weighted below every table arm."""
        if self.channel_range is None or not self.cfg.refine:
            return
        low = min(prior) * 1e-3
        for a in list(arms):
            for v in self.channel_variants(a, key, self.channel_range):
                if v not in arms:
                    arms.append(v)
                    prior.append(low)

    def _with_pairs(self, arms: list[Arm], prior: list[float], key: CellKey) -> None:
        """The race's pair probes (`RaceConfig.probe_pairs`): every (algo, proto) that NCCL's
        model of the shape offers and the policy allows, and no table arm has, at NCCL's
        channels and chunk, weighted below every table arm in the order of the model's
        estimate, as far as that estimate is within `RaceConfig.probe_reach` of the best
        pair's (online/probes.py). The race looks at each once, so a pair the table leaves
        out is still tried (as `dynamiccl bench tune` adds them in the sidecar's setting)."""
        rc, allowed = self.cfg.race, self.allowed_pairs
        if not rc.probe_pairs or allowed is None or self.channel_range is None:
            return
        model = self.defaults.model(key.nranks, key.nnodes)
        if model is None or not self.cfg.refine:
            return
        t = model.times([key.collective.nccl_id], [2.0 ** (key.bucket + 0.5)])[0]
        have = {(a[0], a[1]) for a in arms}
        est = {
            (a, p): float(t[a, p]) for a, p in sorted(allowed) if a < t.shape[0] and p < t.shape[1]
        }
        low = min(prior) * 1e-2
        for k, (a, p) in enumerate(probe_order(est, have, rc.probe_reach)):
            arms.append((a, p, 0, 0))
            prior.append(low * 0.5**k)

    def _cell_tuner(self, cell: Cell, key: CellKey) -> CellTuner:
        """A cell's arms (`cell_arms`, the pair probes, the channel variants) and tuner."""
        pick = self.defaults.pick(key.collective.nccl_id, key.bucket, key.nranks, key.nnodes)
        default = (pick[0], pick[1], 0, 0) if pick is not None else None
        arms, prior, d = cell_arms(cell, default)
        self._with_pairs(arms, prior, key)
        self._with_variants(arms, prior, key)
        groups, channels = [(a[0], a[1]) for a in arms], [a[2] for a in arms]
        tuner = cell_tuner(groups, channels, prior, d, cfg=self.cfg, key=key)
        return CellTuner(cell, arms, d, tuner, exploring=tuner.exploring)

    def channel_variants(self, arm: Arm, key: CellKey, channels: tuple[int, int]) -> list[Arm]:
        """`arm` with every other channel count in `channels` the communicator allows."""
        lo, hi = channels
        model = self.defaults.model(key.nranks, key.nnodes)
        if model is not None:  # NCCL never runs more channels than the communicator has
            hi = min(hi, int(model.max_channels([arm[0]])[0]))
        return [
            (arm[0], arm[1], n, arm[3]) for n in NCHANNEL_CHOICES if lo <= n <= hi and n != arm[2]
        ]

    def observe(  # noqa: PLR0917 -- one attributed call
        self, scale: int, coll: int, bucket: int, nranks: int, nnodes: int, arm: Arm, time_us: float
    ) -> None:
        """Credit one measured call to its arm (ignored if the cell is not tuned)."""
        ct = self._tuner((scale, coll, bucket), nranks, nnodes)
        if ct is None:
            return
        i = ct.index.get(arm)
        if i is None:
            if ct.default_arm is None or arm[2:] != (0, 0):
                return
            d = ct.arms[ct.default_arm]
            if (arm[0], arm[1]) != (d[0], d[1]):
                return
            i = ct.default_arm
        if not time_us > 0:
            return
        ct.tuner.observe(i, time_us)
        ct.calls += 1
        ct.since_epoch += 1
        if not self.rounds and ct.since_epoch >= self.cfg.epoch_calls:
            self._fold(ct)

    def end_round(self, stretch: float | None = None) -> None:
        """A table round ends (the proposer may publish the next table): every cell with
        `epoch_calls` calls since its last fold plans its next epoch, which the coming
        round runs at the scale of this one's calls (`plan.round_plan`), and so does a
        cell whose escape is due (`escape_due`) with fewer.

        `stretch`: an early round (sidecar/table_changes.py, a cell's escape due): only the
        cells whose escape is due fold, and their calls count `stretch` times (the full
        interval over this round's length) toward the scale of the round they plan, which
        runs the full interval: a busy cell's next round explores an epoch's looks, not
        `stretch` times as many."""
        for ct in list(self.cells.values()):
            if stretch is None and ct.since_epoch >= self.cfg.epoch_calls:
                self._fold(ct)
            elif _escape_due(ct):
                self._fold(ct, stretch or 1.0)

    def escape_due(self) -> bool:
        """Whether some cell's calls since its last fold measured an arm far ahead of its
        committed one (`BucketTuner.escape_due`): the round should end now, not after
        `min_interval_s` (sidecar/table_changes.py), since every call of a badly slow
        committed configuration costs the gap (docs/benchmarks.md, "NCCL's default badly
        wrong"). Asked once per coordination step, never per call."""
        return self.rounds and any(_escape_due(ct) for ct in self.cells.values())

    def _fold(self, ct: CellTuner, stretch: float = 1.0) -> None:
        ct.round_calls, ct.since_epoch = round(ct.since_epoch * stretch), 0
        for i in self.vetoes.indices(cell_id(ct.cell), ct.index):
            ct.tuner.banned[i] = True  # step time rejected it (step_judge.py)
        ct.tuner.end_epoch()
        self._collect(ct)

    def _collect(self, ct: CellTuner) -> None:
        """Report the epoch's events."""
        new = ct.tuner.events[ct.seen_events :]
        ct.seen_events = len(ct.tuner.events)
        out = []
        for ev in new:
            kind = _EVENT_KINDS.get(ev.kind)
            if kind is not None:
                msg = f"{ev.detail}: arm {choice_of(ct.arms[ev.arm]).model_dump(mode='json')}"
                out.append(cell_event(ct.cell, kind, ct.calls, msg))
        if ct.exploring and not ct.tuner.exploring:
            out.append(cell_event(ct.cell, EventKind.EXPLORATION_DONE, ct.calls))
        ct.exploring = ct.tuner.exploring
        self.add_events(out)

    def add_events(self, out: list[TunerEvent]) -> None:
        """Queue events to report (at most `MAX_PENDING_EVENTS` wait; the rest are counted)."""
        room = max(MAX_PENDING_EVENTS - len(self.events), 0)
        self.events.extend(out[:room])
        self.dropped_events += max(len(out) - room, 0)

    def take_events(self, limit: int = MAX_EVENTS_PER_BATCH) -> list[TunerEvent]:
        """Hand out (and forget) up to `limit` pending events."""
        out, self.events = self.events[:limit], self.events[limit:]
        return out

    def signature(self) -> tuple[object, ...]:
        """What a new table would change materially (see the module docstring)."""
        return (
            tuple(
                (
                    cid,
                    ct.tuner.plan.committed,
                    tuple(sorted(a for a, _ in ct.tuner.plan.candidates)),
                    ct.tuner.exploring,
                )
                for cid, ct in sorted(self.cells.items())
            )
            + self.vetoes.signature()
        )

    def _cell(self, ct: CellTuner) -> Cell:
        plan = ct.tuner.plan
        if self.rounds:
            plan = round_plan(plan, self.cfg.epoch_calls, ct.round_calls)
        cid, nccl = (
            cell_id(ct.cell),
            ct.arms[ct.default_arm] if ct.default_arm is not None else None,
        )
        arm = ct.arms[plan.committed]
        committed = self.vetoes.committed(cid, arm, nccl)
        base = ct.cell
        if (committed == nccl and not base.choices) or self.vetoes.to_nccl(cid, arm):
            choices: tuple[Choice, ...] = ()
        else:
            rest = [c for c in base.choices if arm_of(c) != committed]
            choices = (choice_of(committed), *self.vetoes.unvetoed(cid, rest))[:4]
        cands = tuple(
            Candidate(**choice_of(ct.arms[a]).model_dump(), weight=w)
            for a, w in plan.candidates
            if not self.vetoes.is_bad(cid, ct.arms[a])
        )
        return Cell(
            collective=base.collective,
            bucket=base.bucket,
            scale=base.scale,
            choices=choices,
            candidates=cands,
            explore=plan.explore if cands else 0.0,
        )

    def table(self, version: int) -> DecisionTable | None:
        """The preferred table under `version` (None without a base table)."""
        if self.base is None:
            return None
        tuned = {cid: self._cell(ct) for cid, ct in self.cells.items()}
        cells = [tuned.get(cell_id(c)) or self.vetoes.untuned(c) for c in self.base.cells]
        return DecisionTable(
            version=version,
            scales=self.base.scales,
            cells=tuple(cells),
            # the tuners decide how much to explore (budget, CUSUM re-opening): no decay
            explore=ExploreSchedule(seed=self.base.explore.seed, half_life_log2=None),
        )


def _escape_due(ct: CellTuner) -> bool:
    return ct.since_epoch > 0 and ct.tuner.escape_due()

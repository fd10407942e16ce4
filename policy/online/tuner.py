"""The online tuner of one cell: a noise-aware race over the policy's candidates
(race.py), epoch-wise table updates, CUSUM re-exploration and the guardrail.

How it fits the agreement invariant (docs/architecture.md, 'Invariants'): within an epoch the plan
(committed configuration, up to `MAX_CANDIDATES` weighted exploration
candidates, explore probability) is part of the agreed decision table, and the
configuration call j tries is the plugin's `dynamiccl.api.table.decide` rule:
a pure function of (job seed, communicator id, nRanks, nNodes, collective, size
bucket, j) through `explore_hash`. `BucketTuner.arm_for_call` evaluates exactly
that rule (tests compare it with `table.decide`). Measured times only change
the plan of the *next* epoch, which the sidecar publishes as a new table
version through the epoch protocol. An epoch ends after `epoch_calls` calls, or
earlier at the call where `escape_due` says a look measured an arm far ahead of the
committed one (the drivers ask it: `bench tune` per call, the sidecar once per
coordination step). Pure state and arithmetic: no I/O, no clocks.

Epoch update, in order:
1. guardrail: if the committed configuration (the one the table exploited) now
   measures worse than NCCL's default by more than the threshold (against the
   default's own measurements, or against the sidecar's estimate of the default
   when exploration never measured it), it is banned and the cell reverts to
   the default; leaving the default again then needs evidence that a
   candidate beats it;
2. leader = eligible measured arm with the lowest sample mean log-time; the
   committed arm moves to it when it is out or banned, or for a gain larger
   than its uncertainty (no flapping); at the epoch end where the budget is
   spent, to the arm whose time is lowest even `RaceConfig.final_z` standard
   errors against it (the final choice: no hysteresis left to protect, and no
   lucky one-call arm);
3. plan = the race's looks (race.py): the leader committed, the arms that can
   still change the answer as candidates, the committed arm keeping at least
   1 - explore_budget of the calls.
A CUSUM alarm on the committed arm's samples forgets all statistics and bans
and re-opens exploration with the prior weights.
"""

from __future__ import annotations

__all__ = [
    "SIDECAR_EPOCH_CALLS",
    "BucketTuner",
    "CellKey",
    "Event",
    "Plan",
    "TunerConfig",
    "cell_tuner",
    "plan_cell",
    "plan_choice",
    "sidecar_setting",
]

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

from dynamiccl.policy.online.bandit import ArmStats
from dynamiccl.policy.online.commit import escape, final_choice, is_out
from dynamiccl.policy.online.cusum import Cusum
from dynamiccl.policy.online.guardrail import beats, trips, trips_estimate
from dynamiccl.policy.online.plan import (
    CellKey,
    Event,
    Plan,
    plan_cell,
    plan_choice,
    race_candidates,
)
from dynamiccl.policy.online.race import (
    LOOK_CALLS,
    Race,
    RaceConfig,
    Rung,
    channel_ladder,
    decided,
    pair_probes,
    race,
)
from dynamiccl.policy.online.tuner_config import SIDECAR_EPOCH_CALLS, TunerConfig, sidecar_setting


@dataclass
class BucketTuner:
    """Online tuning state of one cell (communicator, collective, size bucket)."""

    n_arms: int
    default_arm: int | None
    cfg: TunerConfig
    key: CellKey
    prior_weights: Sequence[float] | None = None
    default_log_time: float | None = None
    ladder: Sequence[Rung] | None = None  # the arms' channel rungs (race.channel_ladder)
    stats: list[ArmStats] = field(init=False)
    banned: list[bool] = field(init=False)
    reverted: bool = field(init=False, default=False)
    epoch: int = field(init=False, default=0)
    committed: int = field(init=False, default=0)
    plan: Plan = field(init=False)
    events: list[Event] = field(init=False, default_factory=list)
    _cusum: Cusum = field(init=False)
    _ref: ArmStats = field(init=False, default_factory=ArmStats)
    _calls_open: int = field(init=False, default=0)  # budget calls of this opening
    _calls_epoch: int = field(init=False, default=0)  # calls since the last epoch end
    _ss: float = field(init=False, default=0.0)  # sum of the arms' squared deviations
    _dof: int = field(init=False, default=0)  # and their degrees of freedom
    _top: int = field(init=False, default=0)  # the prior's first choice
    _trusted: bool = field(init=False, default=True)  # the prior's gate is closed
    _order: list[object] | None = field(init=False, default=None)  # groups, prior's best first

    def __post_init__(self) -> None:
        if self.n_arms < 1:
            raise ValueError("n_arms must be >= 1")
        if self.default_arm is not None and not 0 <= self.default_arm < self.n_arms:
            raise ValueError(f"default_arm {self.default_arm} outside 0..{self.n_arms - 1}")
        if self.prior_weights is not None and len(self.prior_weights) != self.n_arms:
            raise ValueError("prior_weights must have one entry per arm")
        self._cusum = Cusum(self.cfg.cusum)
        self._open()

    # --- the schedule (what every rank evaluates) -------------------------
    def arm_for_call(self, j: int) -> int:
        """The arm the j-th call of this cell tries (rank-identical)."""
        return plan_choice(self.plan, self.key, j)

    def chosen(self) -> int:
        """The arm this cell exploits now (the table's first choice)."""
        return self.committed

    @property
    def budget_spent(self) -> bool:
        """True once this opening has seen `budget_calls` calls, counting at most
        `epoch_calls` per epoch: an epoch that runs longer (the sidecar's table round of a
        busy cell, sidecar/tuning.py) explores only an epoch's expected calls
        (`plan.round_plan`), so it spends only an epoch of the budget."""
        return self.cfg.budget_calls is not None and self._calls_open >= self.cfg.budget_calls

    @property
    def exploring(self) -> bool:
        """True while the current plan explores."""
        return bool(self.plan.candidates) and self.plan.eps_q16 > 0

    def noise_sd(self) -> float:
        """Pooled per-call noise estimate (log units)."""
        b = self.cfg.bandit  # = bandit.pooled_noise_sd(self.stats, b), kept up to date in O(1)
        return math.sqrt((b.noise_dof * b.noise_sd**2 + self._ss) / (b.noise_dof + self._dof))

    # --- measurements ------------------------------------------------------
    def observe(self, arm: int, time_us: float) -> None:
        """Record one measured time of `arm`; may trigger the change detector."""
        if not 0 <= arm < self.n_arms:
            raise ValueError(f"arm {arm} outside 0..{self.n_arms - 1}")
        if not (time_us > 0 and math.isfinite(time_us)):
            raise ValueError(f"time_us must be finite and > 0, got {time_us}")
        y = math.log(time_us)
        st = self.stats[arm]
        self._ss -= st.sum_sq_dev
        self._dof += 1 if st.n else 0
        st.add(y)
        self._ss = max(0.0, self._ss + st.sum_sq_dev)
        if self._calls_epoch < self.cfg.epoch_calls:
            self._calls_open += 1
        self._calls_epoch += 1
        if arm == self.committed:
            self._watch(y)

    def escape_due(self) -> bool:
        """True when this epoch's calls measured an arm so far ahead of the committed one
        (`commit.escape`'s rule against the committed arm) that the epoch's end should
        come now: the committed arm's further calls cannot change the decision, and each
        costs the gap. The drivers then fold at once (bench_tune, the sidecar's early round,
        sidecar/tuning.py); the same arithmetic on the same agreed measurements."""
        c, st = self.committed, self.stats
        if not self._calls_epoch or not st[c].n or self.budget_spent or self.banned[c]:
            return False
        eligible = [not b for b in self.banned]
        return escape(st, eligible, self.noise_sd(), self.cfg.race, c) != c

    # --- epoch boundary ----------------------------------------------------
    def end_epoch(self) -> Plan:
        """Fold the epoch's measurements into the next epoch's plan."""
        cfg = self.cfg
        self._calls_epoch = 0
        noise = self.noise_sd()
        d = self.default_arm
        if d is not None and self.committed != d and self._regressed(d, noise):
            self.banned[self.committed] = True
            self.reverted = True
            self.events.append(
                Event("guardrail", self.epoch, self.committed, "worse than NCCL default")
            )
        eligible = [not b for b in self.banned]
        self._race_epoch(eligible, noise, cfg.race)
        self.epoch += 1
        return self.plan

    # --- internals ----------------------------------------------------------
    def _race_epoch(self, eligible: list[bool], noise: float, rc: RaceConfig) -> None:
        """Commit the race's leader when the committed arm is out, banned or clearly
        slower; plan the next epoch's looks (race.py)."""
        if self._trusted and is_out(self.stats, eligible, noise, rc, self._top):
            self._trusted = False  # the prior's first choice is clearly slower: open the gate
        r = self._race(eligible, noise, rc, self._admissible(rc))
        if rc.tail and self._trusted and decided(r, self.committed, self.ladder):
            # the prior's candidates are decided: calls left go to what it ruled out
            self._trusted = False
            r = self._race(eligible, noise, rc, None)
        c, lead, d, st = self.committed, r.leader, self.default_arm, self.stats
        if lead is not None:  # the final choice's rule, mid-race too: never a lucky look
            lead = escape(st, eligible, noise, rc, final_choice(st, eligible, noise, rc))
        if lead is None and self.banned[c]:  # reverted before anything else was measured
            lead = d if d is not None else eligible.index(True)
        if (
            self.reverted
            and d is not None
            and lead is not None
            and lead != d
            and not beats(st[lead], st[d], noise, self.cfg.guardrail)
        ):
            lead = d
        if lead is not None and lead != c:
            se = noise * math.sqrt(1.0 / max(st[lead].n, 1) + 1.0 / max(st[c].n, 1))
            margin = max(self.cfg.switch_margin, self.cfg.switch_z * se)
            gain = st[c].mean - st[lead].mean if st[c].n and st[lead].n else math.inf
            if self.budget_spent:  # exploration ends: the best measured arm, no hysteresis
                margin = 0.0
            if self.banned[c] or c in r.out or gain > margin:
                self.events.append(Event("commit", self.epoch, lead, "new committed arm"))
                self.committed = lead
                self._rewatch()
        self.plan = self._race_plan(r)

    def _race(
        self, eligible: list[bool], noise: float, rc: RaceConfig, admissible: list[bool] | None
    ) -> Race:
        return race(
            self.stats,
            eligible,
            noise,
            rc,
            admissible=admissible,
            ladder=self.ladder,
            order=self._order,
            default=self.default_arm,
            committed=self.committed,
        )

    def _admissible(self, rc: RaceConfig) -> list[bool] | None:
        """The prior's gate: its `prior_top` arms, those within `prior_gate` nats of its
        first choice, and NCCL's pick."""
        w = self.prior_weights
        if not self._trusted or w is None or max(w) <= 0:
            return None
        floor = max(w) * math.exp(-rc.prior_gate)
        top = set(sorted(range(len(w)), key=lambda i: (-w[i], i))[: rc.prior_top])
        if rc.probe_pairs and self.ladder is not None:
            top |= pair_probes(self.ladder, w)
        return [x >= floor or i in top or i == self.default_arm for i, x in enumerate(w)]

    def _race_plan(self, r: Race) -> Plan:
        """The race's looks as a plan (none once the budget is spent)."""
        if self.budget_spent:
            return Plan(committed=self.committed, candidates=(), explore=0.0)
        b = self.cfg.budget_calls
        if b is not None and b - self._calls_open <= self.cfg.epoch_calls:
            fresh = frozenset(i for i, _ in r.wants if not self.stats[i].n)
            if self.cfg.epoch_calls >= 2 * LOOK_CALLS:
                # a long last epoch (a large share of the budget) still looks, with an
                # open arm's share, so that the final choice can judge what it finds
                r = replace(r, steps=r.steps | fresh)
            else:
                # a short one: a first look could not be followed up
                r = replace(r, wants=tuple((i, w) for i, w in r.wants if i not in fresh))
        cands, explore = race_candidates(
            r, self.committed, self.cfg.epoch_calls, self.cfg.explore_budget
        )
        return Plan(committed=self.committed, candidates=cands, explore=explore)

    def _regressed(self, d: int, noise: float) -> bool:
        """Guardrail: committed arm vs the default's measurements, else its estimate."""
        g = self.cfg.guardrail
        mine, ref = self.stats[self.committed], self.stats[d]
        if ref.n >= g.min_samples or self.default_log_time is None:
            return trips(mine, ref, noise, g)
        return trips_estimate(mine, self.default_log_time, noise, g)

    def _open(self) -> None:
        """(Re)start exploration: forget measurements, bans and the revert."""
        self.stats = [ArmStats() for _ in range(self.n_arms)]
        self._ss, self._dof = 0.0, 0
        self.banned = [False] * self.n_arms
        self.reverted = False
        self._calls_open = self._calls_epoch = 0
        prior = list(self.prior_weights) if self.prior_weights is not None else None
        if prior is None or sum(prior) <= 0:
            prior = [1.0] * self.n_arms
        self.committed = self._top = max(range(self.n_arms), key=lambda i: (prior[i], -i))
        if self.ladder is not None:
            ranked = sorted(range(self.n_arms), key=lambda i: (-prior[i], i))
            self._order = list(dict.fromkeys(self.ladder[i][0] for i in ranked))
        self._trusted = True
        self._rewatch()
        rc = self.cfg.race
        every = [True] * self.n_arms
        r = race(
            self.stats,
            every,
            0.0,
            rc,
            admissible=self._admissible(rc),
            ladder=self.ladder,
            default=self.default_arm,
            committed=self.committed,
        )
        self.plan = self._race_plan(r)

    def _rewatch(self) -> None:
        """Start a fresh change detector for the committed arm.

        Its reference is the mean of the committed arm's first `min_reference`
        samples *after* the commit: the samples that made it the leader are
        biased low (the winner's curse) and would read as a shift.
        """
        self._cusum.reset()
        self._ref = ArmStats()

    def _watch(self, y: float) -> None:
        need = self.cfg.cusum.min_reference
        if self._ref.n < need:
            self._ref.add(y)
            return
        sd = self.noise_sd() * math.sqrt(1.0 + 1.0 / need)
        if self._cusum.update(y, self._ref.mean, sd):
            self.events.append(Event("change", self.epoch, self.committed, "CUSUM alarm"))
            self._open()


def cell_tuner(
    groups: Sequence[Hashable],
    channels: Sequence[int | None],
    prior_weights: Sequence[float],
    default_arm: int | None,
    *,
    cfg: TunerConfig,
    key: CellKey,
) -> BucketTuner:
    """A cell's tuner: how `dynamiccl bench tune` and the sidecar (sidecar/tuning.py) both
    build one, from each arm's (algo, proto) group and channel count (None or 0: NCCL's)."""
    return BucketTuner(
        len(groups),
        default_arm,
        cfg,
        key,
        prior_weights=prior_weights,
        ladder=channel_ladder(groups, channels),
    )

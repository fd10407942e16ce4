"""What shapes one cell's online tuning (`TunerConfig`), and the sidecar's setting of it,
which `dynamiccl bench tune --peers` runs as its sidecar row (sidecar/config.py)."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.online.bandit import BanditConfig
from dynamiccl.policy.online.cusum import CusumConfig
from dynamiccl.policy.online.guardrail import GuardrailConfig
from dynamiccl.policy.online.race import RaceConfig

# calls of a cell per plan in the sidecar: a plan reaches the plugin only as a new table,
# one per round (at most every 30 s, sidecar/table_changes.py); the tuner folds once per round
# for every cell with this many calls since its last fold, and a busier round explores only
# this many calls' worth (plan.round_plan), so every cell gets one decision per round and
# decides as `bench tune` does (docs/benchmarks.md, the sidecar's rows)
SIDECAR_EPOCH_CALLS: Final = 16


class TunerConfig(BaseModel):
    """Everything that shapes one cell's online tuning."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandit: BanditConfig = BanditConfig()
    race: RaceConfig = Field(
        default=RaceConfig(), description="the noise-aware race that plans exploration (race.py)"
    )
    cusum: CusumConfig = CusumConfig()
    guardrail: GuardrailConfig = GuardrailConfig()
    epoch_calls: int = Field(default=16, ge=1, description="calls between table updates")
    explore_budget: float = Field(
        default=1.0, ge=0, le=1, description="max fraction of calls off the committed arm"
    )
    switch_margin: float = Field(
        default=0.005, ge=0, description="log-time gain needed to move the committed arm"
    )
    switch_z: float = Field(
        default=1.0, ge=0, description="standard errors of gain needed to move the committed arm"
    )
    budget_calls: int | None = Field(
        default=None, ge=0, description="calls per opening after which exploration stops"
    )
    refine: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description=(
            "> 0: the sidecar's tuning adds the channel variants of the table's arms and "
            "the pair probes to a cell's arms, with a channel range (sidecar/tuning.py)"
        ),
    )

    @classmethod
    def from_policy(cls, spec: NCCLTuningPolicySpec, **overrides: object) -> TunerConfig:
        """The tuner an NCCLTuningPolicy asks for (budget, guardrail threshold, evidence)."""
        g = spec.guardrails
        base = cls(
            guardrail=GuardrailConfig(
                threshold=g.regression_threshold, min_samples=min(g.min_samples, 1000)
            ),
            budget_calls=spec.exploration.budget_calls,
        )
        return base.model_copy(update=overrides)


def sidecar_setting(cfg: TunerConfig) -> TunerConfig:
    """`cfg` as the sidecar runs it (`AgentConfig.tuner`): `SIDECAR_EPOCH_CALLS`-call epochs,
    one per table round (sidecar/tuning.py `Tuning.rounds`), and `RaceConfig.probe_pairs`:
    every (algorithm, protocol) the table leaves out whose NCCL estimate is within
    `RaceConfig.probe_reach` of the best pair's gets one look
    (online/probes.py), so a pair the policy ranks low is still found, without paying for
    pairs NCCL's model puts several times off (docs/benchmarks.md, the sidecar's rows)."""
    race = cfg.race.model_copy(update={"probe_pairs": True})
    return cfg.model_copy(update={"epoch_calls": SIDECAR_EPOCH_CALLS, "race": race})

"""`dynamiccl_learning_loop_*` metrics: what each tick of the learning loop did.

Registered in the ingest process's registry (the loop runs there) and served
on its `/metrics`. Everything comes from the tick's `TickReport`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from dynamiccl.operator.learning.canary import Action
from dynamiccl.operator.learning.loop import TickReport


class LoopMetrics:
    """The loop's counters and the tick duration."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.ticks = Counter("dynamiccl_learning_loop_ticks", "Learning-loop ticks", registry=r)
        self.errors = Counter(
            "dynamiccl_learning_loop_errors",
            "Failed steps of learning-loop ticks, by step",
            ["step"],
            registry=r,
        )
        self.duration = Histogram(
            "dynamiccl_learning_loop_tick_duration_seconds",
            "Time one tick took",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.status_patches = Counter(
            "dynamiccl_learning_loop_tuningrun_status_patches",
            "TuningRun statuses written with jobs' rewards",
            registry=r,
        )
        self.step_refusals = Counter(
            "dynamiccl_learning_loop_step_refusals",
            "Changes not learned from: the collectives got faster, the job's step slower",
            registry=r,
        )
        self.knob_status_patches = Counter(
            "dynamiccl_learning_loop_env_knob_status_patches",
            "NCCLTuningPolicy status.envKnobs writes (the env-knob experiment changed)",
            registry=r,
        )
        self.retrain_jobs = Counter(
            "dynamiccl_learning_loop_retrain_jobs", "Retraining Jobs created", registry=r
        )
        self.registered = Counter(
            "dynamiccl_learning_loop_models_registered",
            "Trained model versions registered",
            registry=r,
        )
        self.rollouts = Counter(
            "dynamiccl_learning_loop_rollout_actions",
            "Canary starts, promotions and rollbacks",
            ["action"],
            registry=r,
        )

    def observe(self, rep: TickReport, seconds: float) -> None:
        """Count one tick's report."""
        self.ticks.inc()
        self.duration.observe(seconds)
        for err in rep.errors:
            self.errors.labels(step=err.split(":", 1)[0][:40]).inc()
        self.status_patches.inc(rep.statuses_patched)
        self.step_refusals.inc(rep.step_refusals)
        self.knob_status_patches.inc(rep.knob_statuses_patched)
        if rep.launched_job:
            self.retrain_jobs.inc()
        self.registered.inc(len(rep.registered))
        if rep.rollout is not None and rep.rollout.action is not Action.NONE:
            self.rollouts.labels(action=rep.rollout.action.value).inc()

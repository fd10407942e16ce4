"""The learning loop's metrics, from tick reports."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from dynamiccl.operator.learning.canary import Action, RolloutStep
from dynamiccl.operator.learning.loop import TickReport
from dynamiccl.operator.learning.metrics import LoopMetrics


def test_a_tick_report_becomes_counters() -> None:
    reg = CollectorRegistry()
    m = LoopMetrics(reg)
    m.observe(
        TickReport(
            statuses_patched=3,
            knob_statuses_patched=1,
            launched_job="retrain-x",
            registered=["v2"],
            rollout=RolloutStep(Action.PROMOTED, "v2", "faster"),
            errors=["env-knob experiment: boom", "rollout: store down: again"],
        ),
        0.2,
    )
    m.observe(TickReport(rollout=RolloutStep(Action.NONE, None, "waiting")), 0.01)

    def val(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    assert val("dynamiccl_learning_loop_ticks_total") == 2
    assert val("dynamiccl_learning_loop_errors_total", step="env-knob experiment") == 1
    assert val("dynamiccl_learning_loop_errors_total", step="rollout") == 1
    assert val("dynamiccl_learning_loop_tuningrun_status_patches_total") == 3
    assert val("dynamiccl_learning_loop_env_knob_status_patches_total") == 1
    assert val("dynamiccl_learning_loop_retrain_jobs_total") == 1
    assert val("dynamiccl_learning_loop_models_registered_total") == 1
    assert val("dynamiccl_learning_loop_rollout_actions_total", action="promoted") == 1
    assert val("dynamiccl_learning_loop_rollout_actions_total", action="none") is None
    assert val("dynamiccl_learning_loop_tick_duration_seconds_count") == 2

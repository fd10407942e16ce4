"""The loop's env-knob step on a real store: record arms, compare jobs, publish the status.

tests/integration/operator/test_store_postgres.py runs the store tests here on
PostgreSQL too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import EnvKnobExperiment
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.learning import features_sync, knob_loop
from dynamiccl.operator.learning.loop import POLICIES, TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.store import knobs as knob_store
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.policy.online import knob_experiment as kx
from dynamiccl.testing.memory_api import MemoryAPI
from tests.knob_samples import report_job, tuned_run
from tests.topology_samples import dgx_h100, h100_job

POLICY: dict[str, Any] = {
    "metadata": {"name": "fleet"},
    "spec": {
        "mode": "learned",
        "constraints": {
            "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512}]
        },
        "exploration": {"envKnobJobPercent": 20},
    },
}


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'experience.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[ExperienceStore]:
    s = open_store(store_url)
    yield s
    s.close()


H100 = StateFeatures.model_validate(h100_job(2))
A100 = StateFeatures.model_validate(
    h100_job(2) | {"topology": dgx_h100("a", 2, gpu="A100", nvls=False)}
)


def _run(
    uid: str,
    env: Mapping[str, str],
    feats: StateFeatures = H100,
    *,
    user: Mapping[str, str] | None = None,
    policy: str = "fleet",
) -> dict[str, Any]:
    return tuned_run(uid, env, feats, user=user, policy=policy)


class PolicyAPI(MemoryAPI):
    """The learning loop tests' in-memory API, holding these TuningRuns and policies."""

    def __init__(self, runs: list[dict[str, Any]], policies: list[dict[str, Any]]) -> None:
        super().__init__()
        for obj in runs:
            self.add(TUNING_RUNS, obj)
        for obj in policies:
            self.add(POLICIES, obj)

    def policy(self, name: str) -> dict[str, Any]:
        return self.objs[(POLICIES.plural, None, name)]


def _step(s: ExperienceStore, api: PolicyAPI, runs: list[dict[str, Any]], now: float) -> int:
    return knob_loop.step(s, api, POLICIES, policies=api.list(POLICIES), runs=runs, now=now)


def test_a_tuning_run_gives_the_arm_its_ranks_ran_with() -> None:
    j = knob_loop.job_knobs(_run("u1", {"NCCL_NTHREADS": "256"}))
    assert j is not None
    assert (j.job_uid, j.policy, j.arm) == ("u1", "fleet", "NCCL_NTHREADS=256")
    # the user's own value wins (the webhook never overrides it)
    j = knob_loop.job_knobs(_run("u2", {"NCCL_NTHREADS": "256"}, user={"NCCL_NTHREADS": "128"}))
    assert j is not None
    assert j.arm == "NCCL_NTHREADS=128"
    assert knob_loop.job_knobs(_run("u3", {}, user={"NCCL_NTHREADS": "lots"})) is None
    untuned = _run("u4", {})
    untuned["spec"]["mode"] = "off"
    assert knob_loop.job_knobs(untuned) is None
    assert knob_loop.job_knobs({"spec": {}}) is None


def test_a_jobs_first_record_stands(store: ExperienceStore) -> None:
    s = store
    first = knob_store.JobKnobs("u1", "fleet", "c-1", "d", "NCCL_NTHREADS=256")
    assert knob_store.record(s, [first], now=1.0) == 1
    later = knob_store.JobKnobs("u1", "fleet", "c-1", "d", "NCCL_NTHREADS=512")
    assert knob_store.record(s, [later, first], now=2.0) == 0
    assert knob_store.assignments(s, "fleet") == [first]
    assert knob_store.assignments(s, "other") == []


def test_bucket_times_aggregate_pods_and_leave_exploration_out(store: ExperienceStore) -> None:
    s = store
    report_job(s, "u1", 1.0, random.Random(0))
    report_job(s, "unrecorded", 1.0, random.Random(0))
    knob_store.record(s, [knob_store.JobKnobs("u1", "fleet", "c", "d", "")])
    rows = knob_store.bucket_times(s, "fleet")
    assert {r.job_uid for r in rows} == {"u1"}
    assert [r.bucket[1] for r in rows] == [10, 11, 12, 13, 14]  # bucket 20 was exploration
    assert all(r.calls == 200 for r in rows)  # 100 calls from each of two pods


def test_the_step_publishes_a_faster_arm_per_cohort_and_only_on_change(
    store: ExperienceStore,
) -> None:
    s = store
    rng = random.Random(5)
    runs = []
    for i in range(10):
        for arm, factor, feats, tag in (
            ("512", 1.0, H100, "h-base"),
            ("256", 0.9, H100, "h-fast"),  # on H100, 256 threads is 10 % faster
            ("512", 1.0, A100, "a-base"),
            ("256", 1.0, A100, "a-same"),  # on A100 it changes nothing
        ):
            uid = f"{tag}-{i}"
            runs.append(_run(uid, {"NCCL_NTHREADS": arm}, feats))
            report_job(s, uid, factor, rng)
    runs.append(_run("elsewhere", {"NCCL_NTHREADS": "256"}, policy="other"))
    api = PolicyAPI(runs, [POLICY | {"status": {}}])
    assert _step(s, api, runs, 1000.0) == 1
    status = EnvKnobExperiment.model_validate(api.policy("fleet")["status"]["envKnobs"])
    h100 = status.cohort(kx.cohort_of(H100)[0])
    a100 = status.cohort(kx.cohort_of(A100)[0])
    assert h100 is not None
    assert a100 is not None
    assert h100.adopted is not None
    assert h100.adopted[0].value == 256
    assert [a.jobs for a in h100.arms] == [10, 10]
    assert h100.arms[1].speedup is not None
    assert 1.08 < h100.arms[1].speedup < 1.14
    assert a100.adopted is None
    assert a100.arms[1].state.value == "exploring"
    assert status.updated == "1970-01-01T00:16:40Z"
    # nothing new: no write ...
    assert _step(s, api, runs, 2000.0) == 0
    assert len(api.patches_of(POLICIES)) == 1
    # ... except the daily rewrite that tells the operator the loop still runs
    assert _step(s, api, runs, 1000.0 + knob_loop.REFRESH_S) == 1
    assert api.policy("fleet")["status"]["envKnobs"]["updated"] == "1970-01-02T00:16:40Z"


def test_policies_without_knobs_or_not_learned_are_left_alone(store: ExperienceStore) -> None:
    s = store
    static = {"metadata": {"name": "s"}, "spec": POLICY["spec"] | {"mode": "static"}}
    bare = {"metadata": {"name": "b"}, "spec": {"mode": "learned"}}
    broken = {"metadata": {"name": "x"}, "spec": {"mode": "sometimes"}}
    api = PolicyAPI([_run("u1", {"NCCL_NTHREADS": "512"})], [static, bare, broken])
    assert _step(s, api, api.list(TUNING_RUNS), 1.0) == 0
    assert api.patches_of(POLICIES) == []
    assert len(knob_store.assignments(s, "fleet")) == 1  # still recorded for later


def test_the_learning_loop_runs_the_step_every_tick(store: ExperienceStore) -> None:
    rng = random.Random(9)
    runs = []
    for i in range(6):
        for arm, factor in (("512", 1.0), ("256", 0.8)):
            runs.append(_run(f"{arm}-{i}", {"NCCL_NTHREADS": arm}))
            report_job(store, f"{arm}-{i}", factor, rng)
    api = PolicyAPI(runs, [POLICY | {"status": {}}])
    loop = LearningLoop(
        store,
        ModelRegistry(store.backend),
        api,
        LoopConfig(namespace="dynamiccl-system", image="i", store_url="s", pvc_name="p"),
    )
    rep = loop.tick()
    assert not [e for e in rep.errors if "env-knob" in e]
    assert rep.knob_statuses_patched == 1
    adopted = api.policy("fleet")["status"]["envKnobs"]["cohorts"][0]["adopted"]
    assert adopted == [{"name": "NCCL_NTHREADS", "value": 256}]


def test_arms_that_cannot_matter_on_a_cohort_are_left_out_once_its_features_are_stored(
    store: ExperienceStore,
) -> None:
    knobs = [
        {"name": "NCCL_SOCKET_NTHREADS", "allowed": [1, 4], "default": 1},
        {"name": "NCCL_IB_QPS_PER_CONNECTION", "allowed": [1, 4], "default": 1},
    ]
    spec = NCCLTuningPolicySpec.model_validate(
        POLICY["spec"] | {"constraints": {"envKnobs": knobs}}
    )
    run = _run("u1", {"NCCL_SOCKET_NTHREADS": "1", "NCCL_IB_QPS_PER_CONNECTION": "1"})
    report_job(store, "u1", 1.0, random.Random(0))
    knob_store.record(store, [j for j in [knob_loop.job_knobs(run)] if j is not None])
    # no features stored for the cohort: nothing is known of its fabric, every arm stays
    (entry,) = knob_loop.experiment_status(store, "fleet", spec, 1.0).cohorts
    assert len(entry.arms) == 3
    assert entry.skipped == []
    features_sync.record_from_runs(store, [run], now=1.0)
    (entry,) = knob_loop.experiment_status(store, "fleet", spec, 2.0).cohorts
    assert [kx.arm_key(kx.arm_of(a.knobs)) for a in entry.arms] == [
        "NCCL_IB_QPS_PER_CONNECTION=1,NCCL_SOCKET_NTHREADS=1",
        "NCCL_IB_QPS_PER_CONNECTION=4,NCCL_SOCKET_NTHREADS=1",
    ]
    assert [s.name.value for s in entry.skipped] == ["NCCL_SOCKET_NTHREADS"]
    assert "infiniband" in entry.skipped[0].reason

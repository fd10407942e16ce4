"""End to end, one job at a time: a network knob value that is faster on a hardware class
is adopted as soon as a thread count with the same effect is; a slower one never is.

Every job goes the product's way: the operator decides it (`reconcile.decide`: its knob
arm, knobs that cannot matter on its class left out), the webhook injects the ConfigMap's
knobs into its pod (`Admission.review`), its sidecars' reward batches land in the
experience store, and after every 5 jobs the learning loop ticks (`LearningLoop.tick`:
status sync, job features, the knob step) and writes the policy's `status.envKnobs`,
which the operator reads for the next job.

The one stand-in is the jobs' measured times (`tests/knob_samples.report_job`): a job
whose pod was injected the faster value measures every bucket 10 % faster, the slower
value 10 % slower, anything else as fast as the baseline; 2 % noise per job. The knob a
pod got is read from the pod the webhook patched, nowhere else.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from dynamiccl import constants as c
from dynamiccl.api.knob_experiment import ArmState, EnvKnobExperiment
from dynamiccl.operator.controller import reconcile
from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.learning.loop import POLICIES, TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.operator.webhook import server as webhook
from dynamiccl.policy.online import knob_experiment as kx
from dynamiccl.testing.memory_api import MemoryAPI
from tests.knob_samples import report_job

Job = Callable[..., dict[str, Any]]
TICK_EVERY = 5
MAX_JOBS = 150
FAST, SLOW = 0.9, 1.1

REFERENCE = [  # the existing knobs: one value 10 % faster, one 10 % slower
    {"name": "NCCL_NTHREADS", "allowed": [512, 256], "default": 512},
    {"name": "NCCL_BUFFSIZE", "allowed": [4 << 20, 8 << 20], "default": 4 << 20},
]
REFERENCE_TRUTH = {("NCCL_NTHREADS", "256"): FAST, ("NCCL_BUFFSIZE", "8388608"): SLOW}
NETWORK = [  # the same effects on network knobs, and socket knobs an IB class cannot use
    {"name": "NCCL_IB_QPS_PER_CONNECTION", "allowed": [1, 4], "default": 1},
    {"name": "NCCL_CROSS_NIC", "allowed": [2, 0], "default": 2},
    {"name": "NCCL_SOCKET_NTHREADS", "allowed": [1, 4], "default": 1},
]
NETWORK_TRUTH = {("NCCL_IB_QPS_PER_CONNECTION", "4"): FAST, ("NCCL_CROSS_NIC", "0"): SLOW}


def _policy(knobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "fleet", "uid": "uid-fleet"},
        "spec": {
            "mode": "learned",
            "constraints": {"envKnobs": knobs},
            "exploration": {"envKnobJobPercent": 50},
        },
    }


@dataclass
class Fleet:
    """The cluster, the operator's decisions, the webhook and the learning loop."""

    store: ExperienceStore
    nodes: list[dict[str, Any]]
    make_job: Job
    truth: Mapping[tuple[str, str], float]
    api: MemoryAPI = field(default_factory=MemoryAPI)
    config_maps: ObjectCache = field(default_factory=ObjectCache)
    injected: list[dict[str, str]] = field(default_factory=list)  # each pod's NCCL knobs
    messages: list[str] = field(default_factory=list)  # each TuningRun's Tuned message
    statuses: list[EnvKnobExperiment] = field(default_factory=list)  # after every tick

    def __post_init__(self) -> None:
        self.loop = LearningLoop(
            self.store,
            ModelRegistry(self.store.backend),
            self.api,
            LoopConfig(namespace="dynamiccl-system", image="i", store_url="s", pvc_name="p"),
        )
        self.webhook = webhook.Admission(self.config_maps, image="dynamiccl:test")
        self.rng = random.Random(11)

    def policy(self) -> dict[str, Any]:
        out: dict[str, Any] = self.api.objs[(POLICIES.plural, None, "fleet")]
        return out

    def run_job(self, i: int) -> None:
        """Job i: decided, its pod injected, its times measured, its TuningRun written."""
        uid = f"u{i:03d}"
        job = self.make_job(name=f"job-{uid}")  # report_job names the job job-<uid>
        job["metadata"]["uid"] = uid
        pols, errors = parse_policies([self.policy()])
        assert errors == []
        out = reconcile.decide(
            reconcile.Inputs(job=job, namespace_labels={}, policies=pols, cluster_nodes=self.nodes)
        )
        assert out is not None
        assert out.config_map is not None
        self.config_maps.on_event("ADDED", out.config_map)
        self.api.add(TUNING_RUNS, out.tuning_run)
        self.messages.append(out.decision.message)
        env = self._pod_env(job["metadata"]["name"])
        self.injected.append(env)
        factor = 1.0
        for (name, value), f in self.truth.items():
            if env.get(name) == value:
                factor *= f
        report_job(self.store, uid, factor, self.rng)  # the stand-in: the measured times

    def _pod_env(self, job_name: str) -> dict[str, str]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{job_name}-0", "labels": {c.LABEL_KUBEFLOW_JOB_NAME: job_name}},
            "spec": {"containers": [{"name": "pytorch", "image": "t"}]},
        }
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "r", "operation": "CREATE", "namespace": "team-a", "object": pod},
        }
        resp = asyncio.run(self.webhook.review(review))["response"]
        patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
        env = patched["spec"]["containers"][0]["env"]
        return {
            e["name"]: e["value"] for e in env if e["name"].startswith("NCCL_") and "value" in e
        }

    def tick(self) -> EnvKnobExperiment:
        rep = self.loop.tick()
        assert not [e for e in rep.errors if "env-knob" in e or "features" in e], rep.errors
        status = EnvKnobExperiment.model_validate(self.policy()["status"]["envKnobs"])
        self.statuses.append(status)
        return status

    def run_until_adopted(self) -> int | None:
        """Jobs until the class's status adopts an arm (None: not within MAX_JOBS)."""
        for i in range(MAX_JOBS):
            self.run_job(i)
            if (i + 1) % TICK_EVERY == 0 and self.tick().cohorts[0].adopted is not None:
                return i + 1
        return None


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ExperienceStore]:
    s = open_store(f"sqlite:///{tmp_path / 'experience.db'}")
    yield s
    s.close()


def _fleet(
    store: ExperienceStore,
    knobs: list[dict[str, Any]],
    truth: Mapping[tuple[str, str], float],
    nodes: list[dict[str, Any]],
    make_job: Job,
) -> Fleet:
    fleet = Fleet(store, nodes, make_job, truth)
    fleet.api.add(POLICIES, _policy(knobs) | {"status": {}})
    return fleet


def _class_nodes(kwok: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [n for name, n in kwok.items() if name.startswith(prefix)]


def test_a_faster_network_value_is_adopted_as_soon_as_a_thread_count_would_be(
    tmp_path: Path, pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    h100 = _class_nodes(kwok_nodes, "gpu-h100-")
    with contextlib.ExitStack() as stores:
        ref_store, net_store = (
            stores.enter_context(contextlib.closing(open_store(f"sqlite:///{tmp_path / n}")))
            for n in ("reference.db", "network.db")
        )
        ref_jobs = _fleet(
            ref_store, REFERENCE, REFERENCE_TRUTH, h100, pytorchjob
        ).run_until_adopted()
        net = _fleet(net_store, NETWORK, NETWORK_TRUTH, h100, pytorchjob)
        net_jobs = net.run_until_adopted()
        _network_adoption_holds(net, ref_jobs, net_jobs)


def _network_adoption_holds(net: Fleet, ref_jobs: int | None, net_jobs: int | None) -> None:
    assert ref_jobs is not None
    assert net_jobs is not None
    assert net_jobs <= ref_jobs, f"network knob adopted after {net_jobs} jobs, reference {ref_jobs}"

    (entry,) = net.statuses[-1].cohorts
    assert entry.description == "H100 x8 nvswitch+nvls, infiniband 8x400G"
    assert entry.adopted is not None
    assert kx.arm_key(kx.arm_of(entry.adopted)) == (
        "NCCL_CROSS_NIC=2,NCCL_IB_QPS_PER_CONNECTION=4,NCCL_SOCKET_NTHREADS=1"
    )
    # the socket transport's knob is not tried on an InfiniBand class, and the status says why
    assert [(s.name.value, s.reason) for s in entry.skipped] == [
        (
            "NCCL_SOCKET_NTHREADS",
            "NCCL's socket transport's (ethernet, TCP); this class's fabric is infiniband",
        )
    ]
    assert {env["NCCL_SOCKET_NTHREADS"] for env in net.injected} == {"1"}
    assert all("not tried: NCCL_SOCKET_NTHREADS" in m for m in net.messages)

    # the slower value: never adopted, and once measured worse never injected again
    for status in net.statuses:
        adopted = status.cohorts[0].adopted or []
        assert {(k.name.value, k.value) for k in adopted}.isdisjoint({("NCCL_CROSS_NIC", 0)})

    # after adoption, a job that does not explore gets the value: the webhook injects it
    after = len(net.injected)
    for i in range(after, after + 20):
        net.run_job(i)
    got = [(env, msg) for env, msg in zip(net.injected[after:], net.messages[after:], strict=True)]
    adopted_jobs = [env for env, msg in got if "adopted in cohort" in msg]
    assert adopted_jobs
    assert all(env["NCCL_IB_QPS_PER_CONNECTION"] == "4" for env in adopted_jobs)
    assert all(env["NCCL_CROSS_NIC"] == "2" for env in adopted_jobs)


def test_a_slower_network_value_is_never_adopted_and_stops_being_tried(
    store: ExperienceStore, pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    knobs = [{"name": "NCCL_IB_QPS_PER_CONNECTION", "allowed": [1, 8], "default": 1}]
    fleet = _fleet(
        store,
        knobs,
        {("NCCL_IB_QPS_PER_CONNECTION", "8"): SLOW},
        _class_nodes(kwok_nodes, "gpu-h100-"),
        pytorchjob,
    )
    worse_at = None
    for i in range(100):
        fleet.run_job(i)
        if (i + 1) % TICK_EVERY == 0:
            (entry,) = fleet.tick().cohorts
            assert entry.adopted is None
            if worse_at is None and entry.arms[1].state is ArmState.WORSE:
                worse_at = i + 1
    assert worse_at is not None
    assert all(env["NCCL_IB_QPS_PER_CONNECTION"] == "1" for env in fleet.injected[worse_at:])


def test_on_a_tcp_class_socket_values_are_tried_and_the_ib_ones_are_not(
    store: ExperienceStore, pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    fleet = _fleet(store, NETWORK, {}, _class_nodes(kwok_nodes, "gpu-l40s-"), pytorchjob)
    for i in range(40):
        fleet.run_job(i)
        if (i + 1) % TICK_EVERY == 0:
            fleet.tick()
    (entry,) = fleet.statuses[-1].cohorts
    assert entry.description.endswith("ethernet 1x100G")
    assert [(s.name.value, s.reason) for s in entry.skipped] == [
        (
            "NCCL_IB_QPS_PER_CONNECTION",
            "NCCL's IB verbs transport's (infiniband, roce); this class's fabric is ethernet",
        ),
        (
            "NCCL_CROSS_NIC",
            "no effect with one NIC per node (NCCL's documentation); this class has 1",
        ),
    ]
    assert {env["NCCL_IB_QPS_PER_CONNECTION"] for env in fleet.injected} == {"1"}
    assert {env["NCCL_CROSS_NIC"] for env in fleet.injected} == {"2"}
    assert {env["NCCL_SOCKET_NTHREADS"] for env in fleet.injected} == {"1", "4"}
    tried = {kx.arm_key(kx.arm_of(a.knobs)) for a in entry.arms}
    assert not any("NCCL_IB_QPS_PER_CONNECTION=4" in t for t in tried)

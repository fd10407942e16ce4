"""Jobs of an env-knob experiment: their TuningRuns as the operator writes them, and
their reward batches as their sidecars send them; knob values NCCL refuses."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.operator.controller import tuningrun
from dynamiccl.operator.controller.configmap import JobRef
from dynamiccl.operator.store.experience import ExperienceStore
from tests.reward_samples import batch, record

K = KnobName
# per network knob, one value just outside each end of NCCL's range, and a gap inside where
# it has one (dynamiccl/api/knob_ranges.py)
OUTSIDE_NCCL_RANGE: dict[KnobName, list[int]] = {
    K.NCCL_IB_QPS_PER_CONNECTION: [0, 129],
    K.NCCL_IB_SPLIT_DATA_ON_QPS: [2],
    K.NCCL_NCHANNELS_PER_NET_PEER: [0, 65],
    K.NCCL_P2P_NET_CHUNKSIZE: [512, 1 << 25, 3 << 16],  # 3 x 64 KiB: not a power of 2
    K.NCCL_SOCKET_NTHREADS: [0, 17],
    K.NCCL_NSOCKS_PERTHREAD: [0, 65],
    K.NCCL_CROSS_NIC: [3],
}


def tuned_run(
    uid: str,
    env: Mapping[str, str],
    features: StateFeatures,
    *,
    namespace: str = "team-a",
    policy: str = "fleet",
    user: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The TuningRun of job `job-<uid>`, tuned by a learned policy with these knob values."""
    job = JobRef("kubeflow.org/v1", "PyTorchJob", f"job-{uid}", namespace, uid)
    d = tuningrun.Decision(
        job=job,
        tuned=True,
        reason="Tuned",
        message="",
        mode=Mode.LEARNED,
        policy_name=policy,
        features=features,
        env_knobs=env,
        user_constraints=user,
    )
    return tuningrun.build(d)


def report_job(
    store: ExperienceStore,
    uid: str,
    factor: float,
    rng: random.Random,
    *,
    namespace: str = "team-a",
) -> None:
    """Two pods' batches of job `job-<uid>`: 5 buckets at `factor` x 40 us (2 % job
    noise), plus an exploratory row that no knob comparison may use."""
    noise = rng.lognormvariate(0.0, 0.02)
    rows = [record(b, mean_time_us=40.0 * (b - 9) * factor * noise) for b in range(10, 15)]
    rows.append(record(20, origin="explore", mean_time_us=1e6))
    job = {"namespace": namespace, "kind": "PyTorchJob", "name": f"job-{uid}", "uid": uid}
    for pod in ("0", "1"):
        p = {"name": f"job-{uid}-{pod}", "uid": f"{uid}-pod-{pod}"}
        store.insert_batch(batch(f"{uid}-pod-{pod}/1", job, p, rows))

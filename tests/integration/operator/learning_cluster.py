"""Shared by the learning loop's integration tests: the namespaces, policy and TuningRun
the loop works on, and the reward batches of the TuningRun's job.

Not a test module: test_learning_loop_kube.py and test_model_lifecycle_kube.py import it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from dynamiccl.api.rewards import RewardBatch
from tests import reward_samples


@contextlib.contextmanager
def loop_env(api: k8s.ApiClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A user namespace with the TuningRun of job llm (uid-llm), an operator namespace, and a
    learned policy (priority 1000, retraining after 6 new rows); yields user_ns, op_ns,
    policy (the object) and tmp; deletes them again."""
    suffix = uuid.uuid4().hex[:6]
    user_ns, op_ns, policy = f"loop-user-{suffix}", f"loop-op-{suffix}", f"loop-{suffix}"
    core = k8s.CoreV1Api(api)
    for ns in (user_ns, op_ns):
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    custom = k8s.CustomObjectsApi(api)
    pol = custom.create_cluster_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        "nccltuningpolicies",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            # a high priority: this test's policy is the primary one whatever else exists
            "spec": {"mode": "learned", "priority": 1000, "retraining": {"minNewExperience": 6}},
        },
    )
    custom.create_namespaced_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        user_ns,
        "tuningruns",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "TuningRun",
            "metadata": {"name": "llm-dynamiccl", "namespace": user_ns},
            "spec": {
                "jobRef": {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "llm",
                    "uid": "uid-llm",
                }
            },
        },
    )
    try:
        yield {"user_ns": user_ns, "op_ns": op_ns, "policy": pol, "tmp": tmp_path}
    finally:
        custom.delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nccltuningpolicies", policy
        )
        for ns in (user_ns, op_ns):
            core.delete_namespace(ns)


def batch(seq: int, records: int = 3) -> RewardBatch:
    """Reward batch `seq` of job llm's pod, `records` records."""
    return reward_samples.batch(
        f"pod-x/{seq}",
        {"namespace": "ignored-by-status", "kind": "PyTorchJob", "name": "llm", "uid": "uid-llm"},
        {"name": "llm-worker-0", "uid": "pod-x"},
        [reward_samples.record(16 + i) for i in range(records)],
    )

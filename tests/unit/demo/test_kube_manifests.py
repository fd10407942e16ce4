"""`make demo-cluster`'s pure parts: chart values, operator arguments, policy, job, rank layout."""

from __future__ import annotations

import yaml

from dynamiccl import constants as c
from dynamiccl.api.tuning_policy import JobKind, Mode, NCCLTuningPolicySpec
from dynamiccl.demo.kube_manifests import (
    GPU_PRODUCT,
    NAMESPACE,
    POLICY,
    RELEASE,
    chart_values,
    demo_policy,
    job_manifest,
    operator_args,
)
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import jobkinds
from dynamiccl.operator.controller.policy_match import applies, parse_policies


def test_the_webhook_is_the_local_process_and_sees_only_the_demo_namespace() -> None:
    v = chart_values(4443)
    assert v["webhook"]["url"] == "https://127.0.0.1:4443/mutate"
    (expr,) = v["webhook"]["namespaceSelectorExpressions"]
    assert expr == {"key": c.LABEL_DEMO_RELEASE, "operator": "In", "values": [RELEASE]}


def test_operator_args_keep_the_charts_and_bind_locally() -> None:
    manifest = yaml.safe_dump_all(
        [
            {"kind": "Service", "metadata": {"name": "x"}},
            {
                "kind": "Deployment",
                "metadata": {"name": "dynamiccl-demo-operator"},
                "spec": {"template": {"spec": {"containers": [{"args": [
                    "operator", "--namespace=dynamiccl-demo-system", "--webhook-port=8443",
                    "--metrics-port=9090", "--webhook-host=0.0.0.0", "--image=img:1",
                ]}]}}},
            },
        ]
    )  # fmt: skip
    args = operator_args(manifest, 5000, 5001, "/kc")
    assert args[:3] == ["operator", "--namespace=dynamiccl-demo-system", "--image=img:1"]
    assert args[3:] == [
        "--webhook-port=5000",
        "--metrics-port=5001",
        "--webhook-host=127.0.0.1",
        "--extra-san=127.0.0.1",
        "--kubeconfig=/kc",
    ]


def test_the_demo_policy_is_the_sample_limited_to_the_demo_namespace() -> None:
    doc = demo_policy()
    assert doc["metadata"] == {"name": POLICY}
    spec = NCCLTuningPolicySpec.model_validate(doc["spec"])
    assert spec.mode is Mode.LEARNED
    assert spec.model.version == "default"
    assert spec.model.canary_version is None
    assert spec.retraining.schedule is None
    assert spec.retraining.min_new_experience == 10**9  # kwok cannot run a retraining Job
    assert spec.priority == 1000  # the loop's primary policy on a shared cluster
    (policy,) = parse_policies([doc])[0]
    mine = {"team": "ml", c.LABEL_DEMO_RELEASE: RELEASE}
    assert applies(policy, JobKind.PYTORCHJOB, {}, mine)
    assert not applies(policy, JobKind.PYTORCHJOB, {}, {"team": "ml"})  # someone else's ml ns


def test_the_job_names_the_demo_policy_and_lands_on_h100_nodes() -> None:
    job = job_manifest()
    assert job["metadata"]["namespace"] == NAMESPACE
    parsed = job_annotations.parse(job["metadata"]["annotations"])
    assert parsed.errors == ()
    assert parsed.policy == POLICY
    for g in jobkinds.replica_groups(job):
        assert g.template is not None
        assert g.template["spec"]["nodeSelector"] == {c.NODE_LABEL_GFD_PRODUCT: GPU_PRODUCT}

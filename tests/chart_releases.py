"""One release of the chart per cluster: what a test does before it installs its own.

The chart's admission policies are cluster-wide and exempt only their own release's
operator (one operator reconciles every job of a cluster). A release that another test,
an interrupted run or `make demo-cluster` left installed therefore refuses the operator
of the release a test installs next: its `<release>-job-config` policy denies every
other writer of a job's `<job>-dynamiccl` ConfigMap, so the new operator never
reconciles a job. The control plane's state outlives a run, so every tier that installs
the chart first drops the policy bindings of the other releases. Not a test module.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from dynamiccl import constants as c


def drop_other_releases_policies(api: k8s.ApiClient, keep: str) -> list[str]:
    """Delete the chart's admission policy bindings of every release but `keep`; their names."""
    adm: Any = k8s.AdmissionregistrationV1Api(api)
    dropped: list[str] = []
    for b in adm.list_validating_admission_policy_binding(label_selector=c.CHART_SELECTOR).items:
        if (b.metadata.labels or {}).get(c.LABEL_INSTANCE) != keep:
            adm.delete_validating_admission_policy_binding(b.metadata.name)
            dropped.append(str(b.metadata.name))
    if dropped:
        print(f"deleted the policy bindings other releases left: {', '.join(dropped)}")
    return dropped

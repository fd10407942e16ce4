"""Shared by the operator integration tests: the repository's CRDs, applied once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def api(admin_api: k8s.ApiClient) -> k8s.ApiClient:
    """The admin client, once the repository's TuningRun and NCCLTuningPolicy CRDs are applied."""
    for name in ("dynamiccl.io_tuningruns.yaml", "dynamiccl.io_nccltuningpolicies.yaml"):
        doc = yaml.safe_load((ROOT / "crds" / name).read_text())
        ext = k8s.ApiextensionsV1Api(admin_api)
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(doc["metadata"]["name"])
            assert current.metadata is not None
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(doc["metadata"]["name"], doc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            assert crd.status is not None
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") == "True":
                break
            time.sleep(0.2)
    return admin_api

"""Kubernetes backends of the epoch protocol (the only module of sidecar/ importing kubernetes).

ConfigMaps per job in the job's namespace (names in `dynamiccl.api.sidecar_objects`),
owned by the job and garbage-collected with it:

- ``<job>-dynamiccl-epochs``: the `EpochRecord` (key ``record``); every change
  is a compare-and-swap through ``metadata.resourceVersion`` (a replace with a
  stale version is refused with 409 Conflict, a create of an existing object
  with 409 AlreadyExists): `KubeCAS`;
- ``<job>-dynamiccl-leader``: the proposer lease (`leader.Lease` on a `KubeCAS`);
- ``<job>-dynamiccl-tables``: published decision tables, one ``binaryData`` key per
  slot (zlib-compressed JSON), each written by a one-key merge patch: `KubeTableStore`;
- ``<job>-dynamiccl-votes-<g>``: the pods' ballots, one key per pod, each written by a
  one-key merge patch without a resourceVersion (no pod's write conflicts with another's):
  `KubeKeys`, `kube_ballots`.

The operator creates the objects (empty) when it first tunes the job and binds
the job's pods to a Role allowing get/update/patch on exactly these names: the sidecar
never creates, lists or reads anything else. Without the operator (tests, a bare
cluster) the objects are created on first write, given create permission.
resourceVersion is opaque by contract; every API server we know of uses
integers, and anything else is mapped to small integers locally.
"""

from __future__ import annotations

import base64
import zlib
from pathlib import Path
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api import sidecar_objects
from dynamiccl.api.table import DecisionTable
from dynamiccl.kubeclient import REQUEST_TIMEOUT_S, api_client
from dynamiccl.sidecar.ballots import BallotBox
from dynamiccl.sidecar.config import JobInfo

KEY_RECORD: Final = "record"
KEY_TABLE: Final = "table.json.z"


def _meta(job: JobInfo, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": {
            c.LABEL_MANAGED_BY: c.MANAGED_BY,
            c.LABEL_PART_OF: c.MANAGED_BY,
            c.LABEL_COMPONENT: component,
            c.LABEL_JOB_NAME: job.name[:63].rstrip("-."),
        },
    }
    if job.api_version:
        meta["ownerReferences"] = [
            {
                "apiVersion": job.api_version,
                "kind": job.kind,
                "name": job.name,
                "uid": job.uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
    return meta


class KubeCAS:
    """A `CASStore` on one key of one ConfigMap."""

    def __init__(self, api: k8s.ApiClient, job: JobInfo, name: str, component: str) -> None:
        self.core: Any = k8s.CoreV1Api(api)  # dict bodies: the typed stubs want models
        self.job = job
        self.name = name
        self.component = component
        self._rv: dict[int, str] = {}

    def _version(self, rv: str) -> int:
        n = int(rv) if rv.isdigit() else len(self._rv) + 1
        self._rv[n] = rv
        if len(self._rv) > 64:
            for k in sorted(self._rv)[:-32]:
                del self._rv[k]
        return n

    def read(self) -> tuple[str | None, int]:
        cm = _read(self.core, self.job, self.name)
        if cm is None:
            return None, 0
        value = (cm.data or {}).get(KEY_RECORD)
        return value, self._version(str(cm.metadata.resource_version))

    def cas(self, expected_version: int, new_value: str) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(self.job, self.name, self.component),
            "data": {KEY_RECORD: new_value},
        }
        try:
            if expected_version == 0:
                self.core.create_namespaced_config_map(
                    self.job.namespace, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            else:
                rv = self._rv.get(expected_version)
                if rv is None:
                    return False
                # a merge patch with the resourceVersion precondition (409 when it moved):
                # the operator's labels and annotations (dynamiccl.io/writer-pods, which
                # the apiserver checks every write against) stay as they are
                patch = {"metadata": {"resourceVersion": rv}, "data": {KEY_RECORD: new_value}}
                self.core.patch_namespaced_config_map(
                    self.name, self.job.namespace, patch, _request_timeout=REQUEST_TIMEOUT_S
                )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            if exc.status == 403 and expected_version == 0:
                return False  # no create right: the operator pre-creates it; re-read

            raise
        return True


class KubeTableStore:
    """Published decision tables: one ConfigMap, one key per slot (version % TABLE_SLOTS)."""

    def __init__(self, api: k8s.ApiClient, job: JobInfo) -> None:
        self.core: Any = k8s.CoreV1Api(api)  # dict bodies: the typed stubs want models
        self.job = job
        self.name = sidecar_objects.tables_name(job.name)

    def put(self, table: DecisionTable) -> None:
        blob = zlib.compress(table.model_dump_json().encode(), 6)
        key = sidecar_objects.table_key(table.version)
        data = {key: base64.b64encode(blob).decode()}
        # a one-key merge patch: tables of other slots are never touched
        _merge(self.core, self.job, self.name, "decision-tables", {"binaryData": data})

    def get(self, version: int) -> DecisionTable | None:
        """The table of `version`, or None if absent or its slot already holds another."""
        cm = _read(self.core, self.job, self.name)
        raw = None if cm is None else (cm.binary_data or {}).get(sidecar_objects.table_key(version))
        if raw is None:
            return None
        table = DecisionTable.model_validate_json(zlib.decompress(base64.b64decode(raw)))
        return table if table.version == version else None


class KubeKeys:
    """A `KeyStore` on one ConfigMap's ``data``: one-key merge patches, created on first
    write when absent (given create permission; the operator pre-creates it)."""

    def __init__(self, api: k8s.ApiClient, job: JobInfo, name: str) -> None:
        self.core: Any = k8s.CoreV1Api(api)  # dict bodies: the typed stubs want models
        self.job = job
        self.name = name

    def put(self, key: str, value: str) -> None:
        _merge(self.core, self.job, self.name, "ballots", {"data": {key: value}})

    def items(self) -> dict[str, str]:
        cm = _read(self.core, self.job, self.name)
        return {} if cm is None else dict(cm.data or {})


def _read(core: Any, job: JobInfo, name: str) -> Any:
    """The ConfigMap `name` of the job's namespace, None if absent."""
    try:
        return core.read_namespaced_config_map(
            name, job.namespace, _request_timeout=REQUEST_TIMEOUT_S
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _merge(core: Any, job: JobInfo, name: str, component: str, content: dict[str, Any]) -> None:
    """Merge-patch `content` (``data`` or ``binaryData`` keys) into ConfigMap `name`, without
    a resourceVersion (only the named keys change); create it when absent."""
    try:
        core.patch_namespaced_config_map(
            name, job.namespace, content, _request_timeout=REQUEST_TIMEOUT_S
        )
        return
    except ApiException as exc:
        if exc.status != 404:
            raise
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, name, component)}
    try:
        core.create_namespaced_config_map(
            job.namespace, body | content, _request_timeout=REQUEST_TIMEOUT_S
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
        _merge(core, job, name, component, content)  # created meanwhile by another pod


def ballot_box(api: k8s.ApiClient, job: JobInfo, pods: int) -> BallotBox:
    """The ballots of a job of `pods` pods on an API client."""
    names = sidecar_objects.votes_names(job.name, pods)
    return BallotBox([KubeKeys(api, job, n) for n in names])


def kube_ballots(job: JobInfo, pods: int, kubeconfig: Path | None = None) -> BallotBox:
    """The ballots of a job of `pods` pods (`vote_groups(pods)` ConfigMaps)."""
    return ballot_box(api_client(kubeconfig), job, pods)


def kube_backends(
    job: JobInfo, kubeconfig: Path | None = None
) -> tuple[KubeCAS, KubeCAS, KubeTableStore]:
    """(epoch record, leader lease, table store) of a job."""
    api = api_client(kubeconfig)
    return (
        KubeCAS(api, job, sidecar_objects.epochs_name(job.name), "epoch-record"),
        KubeCAS(api, job, sidecar_objects.leader_name(job.name), "leader-lease"),
        KubeTableStore(api, job),
    )

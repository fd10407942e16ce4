"""What `make demo-cluster` does about what earlier runs left in the shared control plane:
another release of the chart is named before the real-node demo starts, and a retraining
pod the kwok demo plays may be gone by the time its command ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dynamiccl.demo.kube_sequence import RetrainPod
from dynamiccl.testing.real_node_sessions import RELEASE
from dynamiccl.testing.real_release import other_releases


class _RefusedError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _binding(release: str | None) -> Any:
    labels = {"app.kubernetes.io/name": "dynamiccl"}
    if release is not None:
        labels["app.kubernetes.io/instance"] = release
    return SimpleNamespace(metadata=SimpleNamespace(labels=labels))


def test_other_releases_are_named_by_their_admission_policy_bindings() -> None:
    seen: list[str] = []

    def listing(label_selector: str) -> Any:
        seen.append(label_selector)
        items = [_binding(RELEASE), _binding("dynamiccl-demo"), _binding("dynamiccl-demo"),
                 _binding("team-b"), _binding(None)]  # fmt: skip
        return SimpleNamespace(items=items)

    cl = SimpleNamespace(
        admission=SimpleNamespace(list_validating_admission_policy_binding=listing)
    )
    assert other_releases(cl) == ["dynamiccl-demo", "team-b"]  # not this demo's own release
    assert seen == ["app.kubernetes.io/name=dynamiccl"]


def _played(status: int | None, tmp_path: Path) -> tuple[RetrainPod, list[str]]:
    patched: list[str] = []

    def patch(name: str, ns: str, body: Any) -> None:
        patched.append(body["status"]["phase"])
        if status is not None:
            raise _RefusedError(status)

    rp = RetrainPod.__new__(RetrainPod)  # its command already ran: no process to start
    rp.cl = SimpleNamespace(core=SimpleNamespace(patch_namespaced_pod_status=patch),
                            api_error=_RefusedError)  # fmt: skip
    rp.name = "train-x"
    rp.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    rp.proc.wait()
    return rp, patched


def test_a_retraining_pod_gone_when_its_command_ends_is_no_error(tmp_path: Path) -> None:
    rp, patched = _played(404, tmp_path)  # its Job was deleted meanwhile
    assert rp.finish() is True
    assert patched == ["Succeeded"]
    rp, patched = _played(None, tmp_path)
    assert rp.finish() is True
    assert patched == ["Succeeded"]  # reported as its kubelet would


def test_any_other_refusal_of_the_pods_status_still_fails(tmp_path: Path) -> None:
    rp, _ = _played(403, tmp_path)
    with pytest.raises(_RefusedError):
        rp.finish()

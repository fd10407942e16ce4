"""The chart's ``nodeAgent.ncclTopoFile`` reaches the node agent, and a bad value is refused."""

from __future__ import annotations

import subprocess

import pytest

from tests.unit.operator.test_chart import CHART, _helm, _kind, _template


def _arg(*sets: str) -> list[str]:
    [ds] = _kind(_template(*sets), "DaemonSet")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith("--nccl-topo-file=")]


def test_the_default_is_auto_and_an_admin_turns_it_on_everywhere() -> None:
    assert _arg() == ["--nccl-topo-file=auto"]
    assert _arg("nodeAgent.ncclTopoFile=always") == ["--nccl-topo-file=always"]
    assert _arg("nodeAgent.ncclTopoFile=off") == ["--nccl-topo-file=off"]


@pytest.mark.parametrize("value", ["yes", "Auto", "/etc/topo.xml"])
def test_a_value_outside_the_modes_is_refused(value: str) -> None:
    res = subprocess.run(
        [_helm(), "template", "t", str(CHART), "--set", f"nodeAgent.ncclTopoFile={value}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "ncclTopoFile" in res.stderr

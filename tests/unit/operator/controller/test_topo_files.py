"""NCCL topology files from the nodes' agents to a pod's NCCL_TOPO_FILE, through the product's
own code at each step: node agent (recorded hosts), operator cache and ConfigMap, webhook
mutation, and the pod's init step (the kubelet's part, a ConfigMap volume's files, is the
one stand-in: its keys written as files of a directory)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.api import topo_nodes
from dynamiccl.node_agent import topo_file
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.operator.controller import reconcile, topo_files
from dynamiccl.operator.controller.cache import shrink_config_map, shrink_node_topology
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.webhook import mutate

HOSTS = Path(__file__).resolve().parents[3] / "fixtures" / "hosts"


def _published(layout: str, node: str, mode: topo_file.Mode) -> dict[str, Any]:
    """The NodeTopology object as the operator's cache keeps it."""
    topo = topo_file.with_file(discover(HostRoot(HOSTS / layout), name=node), mode)
    obj = {"metadata": {"name": node}, "status": topo.wire()}
    return shrink_node_topology(json.loads(json.dumps(obj)))


@pytest.fixture(scope="module")
def cluster() -> dict[str, dict[str, Any]]:
    """p5-a, p5-b: AWS p5 (hidden NVSwitches: a file in auto); dgx-1: DGX H100 (none)."""
    return {
        "p5-a": _published("aws-p5", "p5-a", topo_file.Mode.AUTO),
        "p5-b": _published("aws-p5", "p5-b", topo_file.Mode.AUTO),
        "dgx-1": _published("dgx-h100", "dgx-1", topo_file.Mode.AUTO),
    }


def _config_map(
    job: dict[str, Any], kwok: dict[str, Any], topos: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    pols, errs = parse_policies([{"metadata": {"name": "gold"}, "spec": {}}])
    out = reconcile.decide(
        reconcile.Inputs(
            job=job,
            namespace_labels={},
            policies=pols,
            policy_errors=errs,
            cluster_nodes=list(kwok.values()),
            topo_files=topo_files.node_files(topos),
        )
    )
    assert out is not None
    assert out.config_map is not None
    return out.config_map


def _mounted(cm: dict[str, Any], into: Path) -> Path:
    """The ConfigMap volume as the kubelet writes it: data as text, binaryData decoded."""
    into.mkdir()
    for key, value in cm["data"].items():
        (into / key).write_text(value)
    for key, value in (cm.get("binaryData") or {}).items():
        (into / key).write_bytes(base64.b64decode(value))
    return into


def _injected(cm: dict[str, Any], env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    inj = mutate.Injection(
        job_name="llm",
        job_kind="PyTorchJob",
        config_map="llm-dynamiccl",
        image="dynamiccl:test",
        topo_file=c.TOPO_FILE_NODES_KEY in shrink_config_map(cm)["binaryData"],
    )
    pod = {"metadata": {}, "spec": {"containers": [{"name": "t", "image": "t", "env": env or []}]}}
    return mutate.mutate_pod(pod, inj)


def _run_init_step(pod: dict[str, Any], config: Path, plugin_dir: Path, node: str) -> str:
    [step] = [i for i in pod["spec"]["initContainers"] if i["name"] == mutate.INIT_TOPO_FILE]
    args = step["command"][2:]
    args[args.index(mutate.CONFIG_DIR)] = str(config)
    args[args.index(mutate.TOPO_FILE)] = str(plugin_dir / Path(mutate.TOPO_FILE).name)
    assert step["env"] == [
        {"name": c.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    from typer.testing import CliRunner  # noqa: PLC0415

    from dynamiccl.cli import app  # noqa: PLC0415

    res = CliRunner().invoke(app, ["topo-file", *args], env={c.ENV_NODE_NAME: node})
    assert res.exit_code == 0, res.output
    return res.output


def test_a_pod_gets_its_nodes_file_and_nccl_points_at_it(
    pytorchjob: Callable[..., dict[str, Any]],
    kwok_nodes: dict[str, Any],
    cluster: dict[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    cm = _config_map(pytorchjob(), kwok_nodes, cluster)
    nodes = topo_nodes.of_config_map(cm)
    assert set(nodes) == {"p5-a", "p5-b"}  # the DGX shows its NVSwitches: no file
    assert nodes["p5-a"] == nodes["p5-b"]  # one layout, one key
    assert [k for k in cm["data"] if k.startswith(c.TOPO_FILE_KEY_PREFIX)] == [nodes["p5-a"]]
    pod = _injected(cm)
    [trainer] = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env[c.ENV_NCCL_TOPO_FILE] == mutate.TOPO_FILE
    [mount] = [m for m in trainer["volumeMounts"] if mutate.TOPO_FILE.startswith(m["mountPath"])]
    assert mount["readOnly"] is True
    names = [i["name"] for i in pod["spec"]["initContainers"]]
    assert names == [mutate.INIT_INSTALL, mutate.INIT_TOPO_FILE, mutate.SIDECAR]
    config = _mounted(cm, tmp_path / "config")
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    out = plugin / Path(mutate.TOPO_FILE).name
    _run_init_step(pod, config, plugin, "p5-b")
    assert out.read_text() == cluster["p5-b"]["status"]["ncclTopoFile"]["xml"]
    out.unlink()
    said = _run_init_step(pod, config, plugin, "dgx-1")
    assert not out.exists()
    assert "NCCL detects the topology itself" in said


def test_without_files_the_pod_is_as_before(
    pytorchjob: Callable[..., dict[str, Any]],
    kwok_nodes: dict[str, Any],
    cluster: dict[str, dict[str, Any]],
) -> None:
    cm = _config_map(pytorchjob(), kwok_nodes, {"dgx-1": cluster["dgx-1"]})
    assert not any(k.startswith(c.TOPO_FILE_KEY_PREFIX) for k in cm["data"])
    assert "binaryData" not in cm
    pod = _injected(cm)
    assert c.ENV_NCCL_TOPO_FILE not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert mutate.INIT_TOPO_FILE not in {i["name"] for i in pod["spec"]["initContainers"]}


def test_the_users_own_topology_file_wins(
    pytorchjob: Callable[..., dict[str, Any]],
    kwok_nodes: dict[str, Any],
    cluster: dict[str, dict[str, Any]],
) -> None:
    cm = _config_map(pytorchjob(), kwok_nodes, cluster)
    mine = {"name": c.ENV_NCCL_TOPO_FILE, "value": "/data/my-topo.xml"}
    pod = _injected(cm, env=[mine])
    assert [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == mine["name"]] == [mine]
    assert json.loads(pod["metadata"]["annotations"][c.ANNOTATION_USER_NCCL_ENV]) == {
        mine["name"]: mine["value"]
    }


def test_the_pod_stays_within_the_restricted_pod_security_standard(
    pytorchjob: Callable[..., dict[str, Any]],
    kwok_nodes: dict[str, Any],
    cluster: dict[str, dict[str, Any]],
) -> None:
    pod = _injected(_config_map(pytorchjob(), kwok_nodes, cluster))
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "projected", "secret"}
    for vol in pod["spec"]["volumes"]:
        assert set(vol) - {"name"} <= allowed, vol
    [step] = [i for i in pod["spec"]["initContainers"] if i["name"] == mutate.INIT_TOPO_FILE]
    sc = step["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_files_most_nodes_share_come_first_within_the_budget() -> None:
    files = {"a": "<system/>" * 10, "b": "<system/>" * 10, "c": "<x/>" * 40}
    gz = len(topo_nodes.encode(dict.fromkeys(["a", "b"], topo_files.file_key(files["a"]))))
    data = topo_files.config_map_data(files, max_bytes=len(files["a"]) + gz)
    assert topo_nodes.of_config_map({"binaryData": data.binary_data}) == dict.fromkeys(
        ["a", "b"], topo_files.file_key(files["a"])
    )
    assert list(data.data) == [topo_files.file_key(files["a"])]
    assert topo_files.config_map_data({}) == topo_files.NO_FILES


def test_twelve_thousand_five_hundred_nodes_get_their_files() -> None:
    """At 12 500 nodes the map as JSON (587 KB here) was over the 256 KiB budget and both
    files were left out (docs/benchmarks.md); compressed, every node is listed."""
    files = {f"scale-{i:05d}": f"<system layout='{i % 2}'/>" for i in range(12_500)}
    data = topo_files.config_map_data(files)
    nodes = topo_nodes.of_config_map({"binaryData": data.binary_data})
    assert nodes == {n: topo_files.file_key(x) for n, x in files.items()}
    assert len(data.data) == 2
    used = sum(len(v) for v in data.data.values()) + len(
        base64.b64decode(data.binary_data[c.TOPO_FILE_NODES_KEY])
    )
    assert used <= topo_files.MAX_DATA


def test_a_malformed_published_file_is_skipped_not_copied() -> None:
    bad = {"status": {"ncclTopoFile": {"reason": "x", "xml": "y" * (256 * 1024)}}}
    good = {"status": {"ncclTopoFile": {"reason": "x", "xml": "<system/>"}}}
    assert topo_files.node_files({"n1": bad, "n2": good, "n3": {"status": {}}}) == {
        "n2": "<system/>"
    }

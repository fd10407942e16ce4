"""`dynamiccl node-agent` / `discover` command-line errors: one line, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dynamiccl.cli import app

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
  name: c
contexts:
- context: {cluster: c, user: u}
  name: x
current-context: x
users:
- name: u
  user: {token: t}
"""


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_missing_kubeconfig(tmp_path: Path, fixture_root: Any) -> None:
    r = invoke(
        "node-agent",
        "--root",
        str(fixture_root("dgx-h100")),
        "--kubeconfig",
        str(tmp_path / "k"),
        "--once",
    )
    assert r.exit_code == 2
    assert r.output.strip() == f"--kubeconfig: {tmp_path / 'k'}: no such file"


def test_unreachable_api_server_is_one_line(tmp_path: Path, fixture_root: Any) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(KUBECONFIG)
    r = invoke(
        "node-agent",
        "--root",
        str(fixture_root("dgx-h100")),
        "--kubeconfig",
        str(cfg),
        "--once",
        "--node-name",
        "n1",
    )
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert lines[-1].startswith("node-agent: get node n1: ")
    assert "Traceback" not in r.output


def test_garbage_kubeconfig(tmp_path: Path, fixture_root: Any) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text("::: not yaml [")
    r = invoke(
        "node-agent", "--root", str(fixture_root("dgx-h100")), "--kubeconfig", str(cfg), "--once"
    )
    assert r.exit_code == 2
    assert r.output.startswith("kubeconfig: cannot load cluster configuration")


def test_bad_root_for_the_agent(tmp_path: Path) -> None:
    r = invoke("node-agent", "--root", str(tmp_path / "x"), "--once")
    assert r.exit_code == 2
    assert "not a directory" in r.output


def test_discover_writes_nccl_xml(tmp_path: Path, fixture_root: Any) -> None:
    out = tmp_path / "topo.xml"
    r = invoke("discover", "--root", str(fixture_root("pcie-l40s")), "--nccl-xml", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith('<system version="1" name="l40s-node-3">')
    assert "spec: name=l40s-node-3 gpu=L40S" in r.output
    bad = invoke(
        "discover",
        "--root",
        str(fixture_root("pcie-l40s")),
        "--nccl-xml",
        str(tmp_path / "no/dir/x.xml"),
    )
    assert bad.exit_code == 2
    assert bad.output.startswith("--nccl-xml: ")

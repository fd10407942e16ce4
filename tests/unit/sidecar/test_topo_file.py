"""The pod's init step picks its node's topology file and follows nothing else."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynamiccl import constants as c
from dynamiccl.cli import app
from dynamiccl.sidecar import topo_file

KEY = c.TOPO_FILE_KEY_PREFIX + "0123456789abcdef.xml"


def _config(tmp_path: Path, nodes: object, files: dict[str, str]) -> Path:
    d = tmp_path / "config"
    d.mkdir(parents=True)
    raw = json.dumps(nodes).encode()
    (d / c.TOPO_FILE_NODES_KEY).write_bytes(gzip.compress(raw))
    for k, v in files.items():
        (d / k).write_text(v)
    return d


def test_the_nodes_file_is_written_and_others_get_none(tmp_path: Path) -> None:
    config = _config(tmp_path, {"n1": KEY}, {KEY: '<system version="1"/>\n'})
    out = tmp_path / "nccl-topo.xml"
    assert "written" in topo_file.install(config, "n1", out)
    assert out.read_text() == '<system version="1"/>\n'
    other = tmp_path / "other.xml"
    assert "no topology file" in topo_file.install(config, "n2", other)
    assert not other.exists()
    assert topo_file.choose(tmp_path, "n1") is None  # no map at all: no file


@pytest.mark.parametrize("key", ["../../etc/shadow", "nccl-topo-x.xml", "/etc/passwd", 7])
def test_a_key_that_is_not_a_file_key_is_never_followed(tmp_path: Path, key: object) -> None:
    config = _config(tmp_path, {"n": key, "m": KEY}, {KEY: "<system/>"})
    with pytest.raises(topo_file.TopoFileError, match="bad file key"):
        topo_file.choose(config, "n")
    with pytest.raises(topo_file.TopoFileError):  # a map with one bad key is trusted for none
        topo_file.choose(config, "m")
    assert topo_file.choose(_config(tmp_path / "ok", {"m": KEY}, {KEY: "<x/>"}), "m") == "<x/>"


@pytest.mark.parametrize(
    "blob",
    [
        gzip.compress(b"[1, 2]"),
        gzip.compress(b"{not json"),
        gzip.compress(b'"n"'),
        b'{"n": "nccl-topo-0123456789abcdef.xml"}',  # the map as JSON, not compressed
        gzip.compress(b'{"n": "' + b" " * (40 << 20) + b'"}'),  # a bomb: 40 MiB inflated
    ],
)
def test_a_bad_map_never_blocks_the_pod(tmp_path: Path, blob: bytes) -> None:
    config = _config(tmp_path, {}, {})
    (config / c.TOPO_FILE_NODES_KEY).write_bytes(blob)
    out = tmp_path / "t.xml"
    args = ["topo-file", "--config-dir", str(config), "--out", str(out), "--node", "n"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0
    assert "NCCL detects the topology itself" in res.output
    assert not out.exists()


def test_no_node_name_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["topo-file", "--config-dir", str(tmp_path), "--out", str(tmp_path / "x")], env={}
    )
    assert res.exit_code == 2

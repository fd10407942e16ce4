"""The node map of a job's ConfigMap: 12 500 nodes fit the budget, and no bytes a map can hold
make the reader follow another file, run out of memory or fail other than with its error."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl import constants as c
from dynamiccl.api import topo_nodes

A = c.TOPO_FILE_KEY_PREFIX + "0123456789abcdef.xml"
B = c.TOPO_FILE_KEY_PREFIX + "fedcba9876543210.xml"


def _cluster(n: int, name: str) -> dict[str, str]:
    """n nodes, half on one layout's file and half on another's."""
    return {name.format(i): (A if i % 2 else B) for i in range(n)}


@pytest.mark.parametrize(
    "name",
    ["scale-{:05d}", "ip-10-{:07d}.ec2.internal", "gke-train-a100-pool-{:05d}-0c7f"],
)
def test_twelve_thousand_five_hundred_nodes_fit_in_a_fraction_of_the_budget(name: str) -> None:
    nodes = _cluster(12_500, name)
    blob = topo_nodes.encode(nodes)
    as_json = len(json.dumps(nodes, separators=(",", ":")))
    assert as_json > 256 * 1024  # the map as JSON alone is over the ConfigMap's budget
    assert len(blob) < 64 * 1024, len(blob)  # gzip: a quarter of it, at most
    assert topo_nodes.decode(blob) == nodes


def test_the_encoding_is_deterministic_and_the_config_map_form_reads_back() -> None:
    nodes = {"n2": A, "n1": B}
    assert topo_nodes.encode(nodes) == topo_nodes.encode(dict(reversed(nodes.items())))
    cm = {
        "binaryData": {c.TOPO_FILE_NODES_KEY: base64.b64encode(topo_nodes.encode(nodes)).decode()}
    }
    assert topo_nodes.of_config_map(cm) == nodes
    assert topo_nodes.of_config_map({"data": {}}) == {}


def test_a_decompression_bomb_is_refused_within_the_bound() -> None:
    bomb = gzip.compress(b'{"n":"' + b" " * (topo_nodes.MAX_MAP_BYTES + 1) + b'"}', 9)
    assert len(bomb) < 64 * 1024
    with pytest.raises(topo_nodes.TopoNodesError, match="decompressed"):
        topo_nodes.decode(bomb)


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (b"{}", "not gzip"),
        (gzip.compress(b"[1, 2]"), "not an object"),
        (gzip.compress(b"{not json"), "not JSON"),
        (gzip.compress(json.dumps({"n": "../../etc/shadow"}).encode()), "bad file key"),
        (gzip.compress(json.dumps({"n": 7}).encode()), "bad file key"),
        (topo_nodes.encode({"n": A})[:-9], "truncated"),
    ],
)
def test_a_bad_map_is_an_error_that_says_why(blob: bytes, says: str) -> None:
    with pytest.raises(topo_nodes.TopoNodesError, match=says):
        topo_nodes.decode(blob)


def test_a_config_map_whose_map_is_not_base64_is_an_error() -> None:
    with pytest.raises(topo_nodes.TopoNodesError, match="base64"):
        topo_nodes.of_config_map({"binaryData": {c.TOPO_FILE_NODES_KEY: "%%%"}})


@given(st.binary(max_size=512))
def test_any_bytes_decode_to_a_valid_map_or_the_error(blob: bytes) -> None:
    try:
        nodes = topo_nodes.decode(blob)
    except topo_nodes.TopoNodesError:
        return
    assert all(topo_nodes.KEY_RE.fullmatch(k) for k in nodes.values())


@given(st.dictionaries(st.text(max_size=40), st.sampled_from([A, B]), max_size=50))
def test_any_map_round_trips(nodes: dict[str, str]) -> None:
    assert topo_nodes.decode(topo_nodes.encode(nodes)) == nodes


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=0, max_value=63))
def test_a_corrupted_map_is_the_error_or_a_valid_map(noise: bytes, at: int) -> None:
    blob = bytearray(topo_nodes.encode(_cluster(40, "node-{:03d}")))
    blob[at % len(blob) : at % len(blob) + len(noise)] = noise
    try:
        nodes = topo_nodes.decode(bytes(blob))
    except topo_nodes.TopoNodesError:
        return
    assert all(topo_nodes.KEY_RE.fullmatch(k) for k in nodes.values())

"""hack/nccl_log.py: NCCL's INFO lines into facts.

Two fixtures (tests/fixtures/nccl/README.md): rank 0's log recorded on a GPU (NCCL 2.28.9), and
one built by hand from NCCL 2.30.7's format strings for what no GPU run has printed yet (ABI v6,
the chunk-size clamp).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.testing import scripts

nccl_log = scripts.load("nccl_log")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
FIXTURE = FIXTURES / "built-2.30.7-rank0.log"
RECORDED = FIXTURES / "recorded-2.28.9-rank0.log"
PREFIX = "gpu-host:7:7 [0] NCCL INFO "


def _common_facts(log: Any, *, abi: int, shm: str) -> None:
    """What both fixtures share: two ranks on one GPU, each its own NCCL host over sockets."""
    assert log.tuner == nccl_log.Plugin("dynamiccl", abi)
    assert log.profiler == nccl_log.Plugin("dynamiccl", abi)
    assert log.comms == [nccl_log.Comm(rank=0, nranks=2, nnodes=2, local_ranks=1)]
    assert log.coll_channels == 2
    assert log.network == "Socket"
    assert log.hostid == "dynamiccl-gpu-rank0"
    assert log.plugin_lines == [f"using {shm} (epoch interval 64)"]


def test_recorded_log_facts() -> None:
    """What NCCL 2.28.9 printed for rank 0 of two ranks on one GPU (own NCCL_HOSTID each)."""
    log = nccl_log.parse(RECORDED.read_text().splitlines())
    assert log.version == (2, 28, 9)
    assert log.version_text == "2.28.9+cuda13.0"
    _common_facts(log, abi=5, shm="/tmp/dynamiccl-gpu/sweep-2/dynamiccl.shm")
    assert log.warnings == []
    assert log.clamps == []
    by = nccl_log.tuning_by_call(log)  # 2 warm-up + 20 timed calls per point
    assert {k: {(t.algo, t.proto, t.nchannels) for t in v} for k, v in by.items()} == {
        ("AllReduce", 4096): {("ring", "ll", 1)},
        ("AllReduce", 16384): {("ring", "ll", 2)},
        ("AllReduce", 65536): {("ring", "simple", 2)},
    }
    assert [len(v) for v in by.values()] == [22, 22, 19]


def test_fixture_facts() -> None:
    log = nccl_log.parse(FIXTURE.read_text().splitlines())
    assert log.version == (2, 30, 7)
    assert log.version_text == "2.30.7+cuda13.0"
    _common_facts(log, abi=6, shm="/tmp/run/sweep-2/dynamiccl.shm")
    assert log.warnings == [
        "DynamICCL: table of epoch 3 is unusable (reason 2); NCCL's own choice for it"
    ]
    assert log.clamps == [nccl_log.Clamp("AllReduce", 1 << 30, 4 << 20)]
    assert [(t.func, t.count_bytes, t.algo, t.proto, t.nchannels) for t in log.tuning] == [
        ("AllReduce", 4, "ring", "ll", 1),
        ("AllReduce", 4096, "tree", "ll", 2),
        ("AllGather", 2048, "ring", "ll", 1),
        ("ReduceScatter", 2048, "pat", "simple", 1),
        ("AllReduce", 1 << 28, "ring", "simple", 2),
    ]
    by = nccl_log.tuning_by_call(log)
    assert [t.algo for t in by[("AllReduce", 4096)]] == ["tree"]


def test_nccl_2_27_spellings_and_missing_plugins() -> None:
    log = nccl_log.parse(
        [
            PREFIX + "TUNER/Plugin: Using tuner plugin dynamiccl",
            PREFIX + "PROFILER/Plugin: loaded dynamiccl",
            PREFIX + "AllReduce: 8 Bytes -> Algo NVLS_TREE proto Simple",
        ]
    )
    assert log.tuning == [nccl_log.Tuning("AllReduce", 8, "nvls_tree", "simple", 0)]
    none = nccl_log.parse([PREFIX + "PROFILER/Plugin: Could not load dynamiccl"])
    assert none.profiler is None
    assert none.tuner is None
    assert none.version is None


NAMES = st.sampled_from(["RING", "TREE", "PAT", "NVLS", "NVLS_TREE", "COLLNET_DIRECT"])
PROTOS = st.sampled_from(["LL", "LL128", "SIMPLE"])
FUNCS = st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"])


@given(
    st.lists(
        st.tuples(
            FUNCS, st.integers(0, 1 << 40), NAMES, PROTOS, st.integers(0, 63), st.integers(0, 63)
        )
    ),
    st.lists(st.text(max_size=80)),
)
def test_tuning_lines_round_trip_among_noise(
    rows: list[tuple[str, int, str, str, int, int]], noise: list[str]
) -> None:
    """Every TUNING line written with NCCL's format string comes back, whatever is between."""
    lines: list[str] = []
    for i, (func, nbytes, algo, proto, a, b) in enumerate(rows):
        lo, hi = min(a, b), max(a, b)
        if i < len(noise):
            lines.append(noise[i].replace("\n", " "))
        lines.append(
            f"{PREFIX}{func}: {nbytes} Bytes -> Algo {algo} proto {proto} "
            f"channel{{Lo..Hi}}={{{lo}..{hi}}}"
        )
    got = nccl_log.parse(lines).tuning
    assert [(t.func, t.count_bytes, t.nchannels) for t in got] == [
        (f, n, max(a, b) - min(a, b) + 1) for f, n, _, _, a, b in rows
    ]
    assert [t.algo for t in got] == [nccl_log.norm(r[2]) for r in rows]


@given(st.lists(st.text()))
def test_any_text_parses(lines: list[str]) -> None:
    log = nccl_log.parse(lines)
    assert len(log.tuning) <= len(lines)
    assert len(log.warnings) <= len(lines)

"""Response surfaces: generation from the simulator, strict parsing, fuzzing."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.sim.surface import HEADER, SurfaceError, generate, parse_surface, to_csv

HEAD = ",".join(HEADER)


def test_generated_surface_round_trips_and_covers_nccls_default() -> None:
    sim = Simulator(calibration_system("dgx-h200-4gpu"))
    surface = generate(sim, [Collective.ALLREDUCE, Collective.ALLGATHER], [1024, 1 << 20, 1 << 30])
    again = parse_surface(to_csv(surface))
    assert again == surface
    buckets = surface.buckets()
    assert len(buckets) == 6
    for (coll, nbytes), rows in buckets.items():
        default, t, _ = sim.nccl_default(coll, nbytes)
        key = (default.algo, default.proto, None)
        match = [r for r in rows if (r.algo, r.proto, r.nchannels) == key]
        assert len(match) == 1
        assert match[0].time_us == pytest.approx(t, abs=1e-3)
        assert all(r.time_us > 0 and r.stddev_us >= 0 for r in rows)
        assert len(rows) >= 20  # algo/proto pairs x channel variants


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("a,b,c\n", "line 1: header"),
        (f"{HEAD}\n", "no valid row"),
        (f"{HEAD}\n\n\n", "no valid row"),
        (
            f"{HEAD}\nallreduce,8,ring,simple,,1,0\nalltoall,8,ring,simple,,1,0\n",
            "line 3: collective",
        ),
        (f"{HEAD}\nallreduce,-8,ring,simple,,1,0\n", "line 2: nbytes"),
        (f"{HEAD}\nallreduce,8.5,ring,simple,,1,0\n", "line 2: nbytes"),
        (f"{HEAD}\nallreduce,8,ring,simple,0,1,0\n", "line 2: nchannels"),
        (f"{HEAD}\nallreduce,8,ring,simple,,-1,0\n", "line 2: time_us"),
        (f"{HEAD}\nallreduce,8,ring,simple,,nan,0\n", "line 2: time_us"),
        (f"{HEAD}\nallreduce,8,ring,simple,,1,inf\n", "line 2: stddev_us"),
        (f"{HEAD}\nallreduce,8,bogus,simple,,1,0\n", "line 2: algo"),
        (f"{HEAD}\nallreduce,8,ring,ll64,,1,0\n", "line 2: proto"),
        (f"{HEAD}\nallreduce,8,ring,simple,,1\n", "line 2: expected 7 fields"),
        (
            f"{HEAD}\nallreduce,8,ring,simple,,1,0\nallreduce,8,ring,simple,,2,0\n",
            "line 3: duplicate",
        ),
    ],
)
def test_bad_surfaces_name_line_and_field(text: str, message: str) -> None:
    with pytest.raises(SurfaceError) as err:
        parse_surface(text, source="s.csv")
    assert str(err.value).startswith("s.csv: ")
    assert message in str(err.value)


def test_empty_nchannels_means_nccl_default() -> None:
    s = parse_surface(f"{HEAD}\nAllReduce,1024,Ring,LL,,3.5,0.1\nallreduce,1024,ring,ll,4,3.0,0\n")
    assert [r.nchannels for r in s.rows] == [None, 4]
    assert s.best(Collective.ALLREDUCE, 1024).nchannels == 4


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_is_accepted_or_a_surface_error(text: str) -> None:
    with contextlib.suppress(SurfaceError):
        parse_surface(text)


_rows = st.lists(
    st.tuples(
        st.sampled_from(list(Collective)),
        st.integers(min_value=0, max_value=1 << 40),
        st.sampled_from(list(Algo)),
        st.sampled_from(list(Proto)),
        st.one_of(st.none(), st.integers(min_value=1, max_value=64)),
        st.floats(min_value=1e-3, max_value=1e9, allow_nan=False),
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
    ),
    min_size=1,
    max_size=20,
    unique_by=lambda r: r[:5],
)


@settings(max_examples=200, deadline=None)
@given(_rows, st.integers(min_value=0, max_value=40))
def test_fuzz_valid_rows_parse_and_one_corrupted_field_is_named(
    rows: list[tuple[Collective, int, Algo, Proto, int | None, float, float]], which: int
) -> None:
    lines = [HEAD] + [
        f"{c.value},{n},{a.value},{p.value},{'' if k is None else k},{t!r},{s!r}"
        for c, n, a, p, k, t, s in rows
    ]
    surface = parse_surface("\n".join(lines))
    assert len(surface.rows) == len(rows)
    assert all(math.isclose(r.time_us, row[5]) for r, row in zip(surface.rows, rows, strict=True))
    line = 1 + which % len(rows)
    cells = lines[line].split(",")
    field = which % len(HEADER)
    cells[field] = {0: "gather", 1: "-1", 2: "x", 3: "ll256", 4: "0", 5: "-2", 6: "nan"}[field]
    lines[line] = ",".join(cells)
    with pytest.raises(SurfaceError, match=f"line {line + 1}: {HEADER[field]}"):
        parse_surface("\n".join(lines))

"""What every place's sequence prints: a job's line, and when the story's steps happened."""

from __future__ import annotations

from typing import Any

from dynamiccl.demo.story import (
    JobRow,
    format_row,
    from_tuning_run,
    new_findings,
    outcome,
    play,
    rollout_events,
    rollout_of,
)

FINDING = "allreduce/b25/32x4: tree/simple 1.21x"


def _found(algo: str, speedup: float) -> dict[str, Any]:
    return {"collective": "allreduce", "sizeBucket": 27, "algo": algo, "proto": "simple",
            "speedup": speedup}  # fmt: skip


def _row(i: int, model: str, measured: int = 0, **kw: Any) -> JobRow:
    return JobRow(i, f"train-{i:02d}", model, model != "default", measured=[FINDING] * measured,
                  speedup=1.0 + 0.1 * measured, **kw)  # fmt: skip


def test_a_row_is_read_from_the_jobs_tuning_run() -> None:
    run = {
        "spec": {"modelVersion": "v2", "canary": True, "measuredCells": [FINDING]},
        "status": {
            "reward": {"speedup": 1.153, "calls": 30000},
            "exploration": {"exploratoryCalls": 240, "costPercent": 0.41,
                            "found": [_found("tree", 1.25), _found("ring", 1.02)]},
        },
    }  # fmt: skip
    row = from_tuning_run(3, "train-03", run)
    assert (row.model_version, row.canary, row.speedup) == ("v2", True, 1.153)
    assert (row.explored_calls, row.cost_percent, row.measured) == (240, 0.41, [FINDING])
    assert [f["algo"] for f in row.found] == ["tree"]  # 2 % faster is within the noise
    bare = from_tuning_run(1, "train-01", {"spec": {"modelVersion": "default"}})
    assert (bare.speedup, bare.found, bare.explored_calls) == (None, [], 0)


def test_a_line_names_the_canary_what_it_ran_and_what_the_loop_did() -> None:
    row = _row(2, "v1", 1, runs_departure=True, ran_departure=0.76, seconds=57.0,
               found=[_found("tree", 1.25)], events=["promoted v1"])  # fmt: skip
    line = format_row(row)
    assert "v1 (canary)" in line
    assert "  1        yes" in line  # one cell from the class's findings; its table runs it
    assert "1.100" in line
    assert "76%" in line
    assert line.endswith("allreduce 128 MiB tree/simple x1.25; promoted v1")
    assert "  -  " in format_row(_row(1, "default"))  # where the place cannot tell what ran


def test_the_outcome_says_when_it_was_found_held_ran_everywhere_and_was_promoted() -> None:
    rows = [
        _row(1, "default", found=[_found("ring", 1.06)], cost_percent=0.7),
        _row(2, "default", found=[_found("tree", 1.25)],
             events=["finding holds: allreduce 128 MiB tree/simple x1.25 (2 jobs)"]),
        _row(3, "default", 1, runs_departure=True, events=["retrained v1 in 11 s", "canary v1"]),
        _row(4, "v1", 1, runs_departure=True),
        _row(5, "v1", 1, runs_departure=True, events=["promoted v1"]),
    ]  # fmt: skip
    res = outcome(rows, {}, lambda f: f["algo"] == "tree")
    assert (res.found_at, res.holds_after, res.every_job_from) == (2, 2, 3)  # ring: not the story's
    assert (res.parent_with_finding, res.adopted_at, res.promoted_after) == (3, 3, 5)
    assert res.with_finding == [1.1, 1.1, 1.1]
    assert (res.first_speedup, res.max_cost_percent) == (1.0, 0.7)
    lines = res.lines("tree measured faster", 1.0)
    assert "found by exploration: job 2 (tree measured faster)" in lines
    assert "every job starts with it from: job 3 (a parent-model job with it: job 3)" in lines
    assert outcome(rows, {}).found_at == 1  # any configuration found
    hc = {"hardwareClass": "c-1", "cellsSettled": 4, "cellsMeasured": 5,
          "findings": [_found("tree", 1.25) | {"holds": True}, _found("ring", 1.1)],
          "departures": [_found("tree", 1.25) | {"adopted": True}]}  # fmt: skip
    (line,) = outcome(rows, {"hardwareClasses": [hc]}).lines("x", 1.0)[-1:]
    assert line == (
        "class c-1: 4 of 5 measured cells settled; findings that hold: allreduce 128 MiB "
        "tree/simple x1.25; the models' departures: allreduce 128 MiB tree/simple x1.25 adopted"
    )
    # a later job without it: "every job from" moves past it
    rows.append(_row(6, "v1"))
    assert outcome(rows, {}).every_job_from is None


def test_nothing_found_nothing_adopted() -> None:
    res = outcome([_row(1, "default"), _row(2, "v1")], {})
    assert (res.found_at, res.holds_after, res.adopted_at, res.promoted_after) == (None,) * 4
    assert res.every_job_from is None
    assert "found by exploration: job - (x)" in res.lines("x", 1.0)


def test_play_runs_the_jobs_in_a_row_and_prints_each_as_it_ends() -> None:
    class Place:
        def __init__(self) -> None:
            self.n = 0

        def run_job(self) -> JobRow:
            self.n += 1
            return _row(self.n, "default")

        def learning(self) -> dict[str, Any]:
            return {}

    lines: list[str] = []
    rows = play(Place(), 3, lines.append)
    assert [r.index for r in rows] == [1, 2, 3]
    assert len(lines) == 4
    assert "model version" in lines[0]  # the header, then one line per job
    assert lines[3].lstrip().startswith("3 ")


def test_a_finding_is_told_once_when_it_starts_to_hold() -> None:
    finding = _found("tree", 1.25) | {"nranks": 32, "nnodes": 4, "supporting": 2}
    held: set[tuple[Any, ...]] = set()

    def learning(holds: bool) -> dict[str, Any]:
        return {"hardwareClasses": [{"hardwareClass": "c-1",
                                     "findings": [finding | {"holds": holds}]}]}  # fmt: skip

    assert new_findings(learning(False), held) == []  # one job's word: not yet
    assert new_findings(learning(True), held) == [
        "finding holds: allreduce 128 MiB tree/simple x1.25 (2 jobs)"
    ]
    assert new_findings(learning(True), held) == []  # told once


def test_the_rollout_tells_a_canary_a_promotion_and_a_canary_that_ended() -> None:
    def learning(promoted: str, canary: str | None, percent: int = 100) -> dict[str, Any]:
        return {"rollout": {"promoted": promoted, "canary": canary, "canaryPercent": percent}}

    events, now = rollout_events(learning("default", "v1"), (None, None))
    assert (events, now) == (["canary v1", "promoted default"], ("default", "v1"))
    assert rollout_events(learning("default", "v1"), now) == ([], now)  # nothing new
    assert rollout_events(learning("v1", None), now)[0] == ["promoted v1"]
    assert rollout_events(learning("default", None), now)[0] == ["canary v1 ended"]  # rolled back
    assert rollout_of(learning("default", "v2", percent=0)) == ("default", None)  # serves no job

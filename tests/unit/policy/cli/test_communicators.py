"""`dynamiccl policy communicators`: every communicator of a job and the table that covers it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dynamiccl.api.table import MAX_SCALES, decide
from dynamiccl.api.topology import load_topology
from dynamiccl.cli import app
from dynamiccl.policy.cli.shapes import job_features
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.train.inference import new_policy

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "topology-aws-p5-2node.yaml"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["policy", "communicators", "--topology", str(EXAMPLE), *args])
    return result.exit_code, result.output


def test_a_3d_job_lists_every_communicator_and_each_has_cells_in_the_compiled_table() -> None:
    """TP=8, PP=4, DP=8 over 32 nodes of 8 GPUs (the issue's must-show job)."""
    code, out = run("--nodes", "32", "--parallelism", "3d:tp=8,pp=4,dp=8", "--json")
    assert code == 0, out
    doc = json.loads(out)
    rows = {r["group"]: r for r in doc["communicators"]}
    shapes = {g: (r["nranks"], r["nnodes"], r["count"]) for g, r in rows.items()}
    assert shapes == {
        "world": (256, 32, 1),
        "node": (8, 1, 32),
        "tp": (8, 1, 32),
        "dp": (8, 8, 32),  # TP fills a node: one rank per node
        "pp": (4, 4, 64),
    }
    assert {r["status"] for r in rows.values()} == {"table"}
    # the effect: the job's compiled table has a cell the plugin applies for every one
    f = job_features(load_topology(EXAMPLE).model_copy(update={"nodes": 32}), "3d:tp=8,pp=4,dp=8")
    table = compile_table(new_policy(0, hidden=16), f)
    assert doc["free_scale_classes"] == MAX_SCALES - len(table.scales)
    for r in rows.values():
        assert r["scale_class"] in table.scales
        covered = [c for c in table.cells if c.scale == r["scale_class"]]
        assert covered, r
        c = covered[0]
        got = decide(table, c.collective, 1 << c.bucket, r["nranks"], r["nnodes"], 7, 1 << 40,
                     lambda _c: True)  # fmt: skip
        assert got == (c.choices[0] if c.choices else None)


def test_text_output_names_shape_count_scale_and_status_of_a_context_parallel_job() -> None:
    code, out = run("--nodes", "32", "--parallelism", "3d:tp=4,cp=2,pp=4,dp=8")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "job: 256 ranks on 32 nodes of 8 (3d tp=4 cp=2 pp=4 dp=8)"
    table = {ln.split()[0]: ln.split()[1:] for ln in lines[2:-1]}
    assert table["cp"][:3] == ["2", "1", "128"]
    assert table["dp-cp"][:3] == ["16", "8", "16"]
    assert all(v[4] == "table" for v in table.values())
    assert lines[-1].startswith("any other shape: tuned online by the sidecar (1 of 8")


def test_bad_parallelism_is_one_line_and_exit_2() -> None:
    for value, needle in (
        ("3d:tp=8,pp=5", "does not divide the job's 256 ranks"),
        ("3d:tp=8,xx=2", "DIM=N with DIM in dp, tp, pp, ep, cp"),
        ("zero", "expected one of"),
    ):
        code, out = run("--nodes", "32", "--parallelism", value)
        assert code == 2, out
        assert needle in out
    code, out = run()
    assert code == 2
    assert "--parallelism" in out

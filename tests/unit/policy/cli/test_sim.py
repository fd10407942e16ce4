"""`dynamiccl sim predict|calibrate`: JSON contract and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dynamiccl.cli import app

SYSTEMS = Path(__file__).resolve().parents[4] / "policy" / "data" / "calibration" / "systems"
runner = CliRunner()


def predict(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["sim", "predict", *args])
    return result.exit_code, result.output


def test_json_contract_and_nccl_default() -> None:
    code, out = predict(
        "--topology", str(SYSTEMS / "dgx-h200.yaml"), "--collective", "allreduce",
        "--bytes", "32768", "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    for key in ("time_us", "busbw_GBps", "algo", "proto", "nchannels", "nccl_default"):
        assert key in doc
    assert (doc["algo"], doc["proto"]) == ("ring", "ll")  # NCCL's pick, as measured
    nd = doc["nccl_default"]
    assert (nd["algo"], nd["proto"], nd["nchannels"]) == ("ring", "ll", doc["nchannels"])
    assert nd["time_us"] == doc["time_us"] > 0
    assert doc["busbw_GBps"] == pytest.approx(32768 * 2 * 7 / 8 / (doc["time_us"] * 1e3), rel=1e-3)


def test_forced_configuration_against_nccls_pick() -> None:
    code, out = predict(
        "--topology", str(SYSTEMS / "dgx-h200-5gpu.yaml"), "--collective", "allreduce",
        "--bytes", str(8 << 30), "--algo", "nvls", "--proto", "simple", "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert doc["algo"] == "nvls"
    assert doc["nccl_default"]["algo"] == "ring"
    assert doc["speedup_vs_nccl_default"] > 1.1
    assert doc["departures"] == ["nvls-small-team"]


def test_algo_alone_takes_nccls_best_protocol() -> None:
    code, out = predict(
        "--topology", str(SYSTEMS / "azure-ndmv4-2node.yaml"), "--collective", "allreduce",
        "--bytes", "1024", "--algo", "ring", "--nchannels", "2", "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["algo"], doc["proto"], doc["nchannels"]) == ("ring", "ll", 2)


def _topology(tmp_path: Path, **over: object) -> Path:
    spec = yaml.safe_load((SYSTEMS / "dgx-h200.yaml").read_text()) | over
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("over", "args", "message"),
    [
        ({"gpu": "X100"}, [], "gpu: 'X100' is not a known GPU"),
        ({"intra": "pcie", "nvlink_GBps": 0}, [], "nvls: true needs intra: nvswitch"),
        ({}, ["--collective", "alltoall"], "collective: 'alltoall' is not one of"),
        ({}, ["--bytes", "-1"], "bytes: must be >= 0"),
        ({}, ["--algo", "pat"], "no available configuration"),
        ({}, ["--algo", "nvls", "--proto", "ll"], "nvls/ll unavailable for allreduce"),
        ({}, ["--algo", "fast"], "algo: 'fast' is not one of"),
        ({}, ["--nchannels", "0"], "nchannels: must be in 1..64"),
        ({}, ["--harness", "mpi"], "harness: 'mpi' is not one of"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, over: dict[str, object], args: list[str], message: str
) -> None:
    base = {"--collective": "allreduce", "--bytes": "1024"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["--topology", str(_topology(tmp_path, **over))]
    for flag, value in base.items():
        argv += [flag, value]
    code, out = predict(*argv)
    assert code == 2, out
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, out
    assert message in lines[0]
    assert "Traceback" not in out


def test_missing_topology_file(tmp_path: Path) -> None:
    code, out = predict(
        "--topology", str(tmp_path / "nope.yaml"), "--collective", "allreduce", "--bytes", "8"
    )
    assert code == 2
    assert "cannot read" in out


def test_calibrate_json_reports_every_row() -> None:
    result = runner.invoke(app, ["sim", "calibrate", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert len(doc["rows"]) >= 40
    row = doc["rows"][0]
    for key in ("id", "system", "collective", "nbytes", "measured_us", "predicted_us", "error_pct"):
        assert key in row
    assert doc["in_sample"]["median_abs_error_pct"] <= 15.0
    assert "loso" not in doc  # only with --report

"""`dynamiccl operator` argument checks that need no cluster."""

from __future__ import annotations

from typer.testing import CliRunner

from dynamiccl.cli import app


def test_watch_namespace_with_peering_is_rejected_in_one_line() -> None:
    result = CliRunner().invoke(
        app, ["operator", "--watch-namespace", "team-*", "--peering", "dynamiccl"]
    )
    assert result.exit_code == 2
    out = result.output.strip()
    assert len(out.splitlines()) == 1
    assert "--watch-namespace cannot be combined with --peering" in out
    assert "Traceback" not in out


def test_cert_check_interval_must_be_positive() -> None:
    result = CliRunner().invoke(app, ["operator", "--cert-check-interval", "0"])
    assert result.exit_code == 2
    assert "cert-check-interval" in result.output

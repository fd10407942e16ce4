"""The chart's trust boundaries (issue 19): secrets, ServiceAccounts, mounts, RBAC."""

from __future__ import annotations

import json
import subprocess

from tests.unit.operator.test_chart import CHART, _helm, _kind, _template


def _ingest_container() -> dict[str, object]:
    [dep] = [
        d for d in _kind(_template(), "Deployment") if d["metadata"]["name"].endswith("-ingest")
    ]
    [ctr] = dep["spec"]["template"]["spec"]["containers"]
    return ctr  # type: ignore[no-any-return]


def test_the_store_url_is_never_on_a_command_line() -> None:
    """Item 8: $(VAR) in args is expanded into argv, readable by every process in /proc."""
    ctr = _ingest_container()
    assert not [a for a in ctr["args"] if "STORE_URL" in a or a.startswith("--store")]  # type: ignore[attr-defined]
    secret = _template("store.urlSecret=pg", "store.persistence.enabled=true")
    text = json.dumps(secret)
    assert '"secretKeyRef": {"name": "pg", "key": "url"}' in text


def test_a_store_url_with_a_password_is_refused() -> None:
    args = [_helm(), "template", "t", str(CHART), "--set", "store.url=postgresql://u:pw@db/x"]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode != 0
    assert "store.urlSecret" in res.stderr
    assert "pw@" not in res.stderr

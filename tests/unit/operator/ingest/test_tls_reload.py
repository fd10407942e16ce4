"""Issue 19, item 11: the ingest serves a renewed certificate without a restart.

The ingest process starts on certificate A; the files are replaced by B the way
the kubelet updates a Secret volume (new files, then an atomic rename); within a
few reload intervals a new TLS connection is served B, while the process never
restarted. A pair that does not load (key of another certificate) keeps B served.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynamiccl.testing import certs

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def served_fingerprint(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def fingerprint(crt: Path) -> str:
    """The serving certificate's: the first of the file (its CA follows)."""
    first = crt.read_text().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----"
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(first)).hexdigest()


def replace(live: Path, new: Path) -> None:
    """Swap the live pair for another, file by file with atomic renames."""
    for name in ("tls.crt", "tls.key"):
        tmp = live / f".{name}.new"
        tmp.write_bytes((new / name).read_bytes())
        os.replace(tmp, live / name)


def wait_for(port: int, want: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    got = served_fingerprint(port)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = served_fingerprint(port)
    return got


@pytest.mark.slow
def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    live, a, b = tmp_path / "live", tmp_path / "a", tmp_path / "b"
    certs.write_self_signed(a)
    certs.write_self_signed(b)
    live.mkdir()
    replace(live, a)
    kubeconfig = tmp_path / "kubeconfig"  # never contacted: no request reaches the auth
    kubeconfig.write_text(KUBECONFIG)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.operator.ingest.main",
            *("--store", str(tmp_path / "experience.db")),
            *("--host", "127.0.0.1", "--port", "0"),
            *("--tls-cert", str(live / "tls.crt"), "--tls-key", str(live / "tls.key")),
            *("--tls-reload-interval", "0.2"),
            *("--kubeconfig", str(kubeconfig)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        port = int(line.split('"port": ')[1].split(",")[0])
        assert served_fingerprint(port) == fingerprint(a / "tls.crt")
        replace(live, b)
        assert wait_for(port, fingerprint(b / "tls.crt")) == fingerprint(b / "tls.crt")
        # a broken pair (B's certificate, A's key) is not served: B stays
        (live / "tls.key").write_bytes((a / "tls.key").read_bytes())
        time.sleep(0.6)
        assert served_fingerprint(port) == fingerprint(b / "tls.crt")
        assert proc.poll() is None  # the same process all along
    finally:
        proc.terminate()
        proc.wait(20)

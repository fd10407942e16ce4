"""dynamiccl.testing.certs: a TLS client that trusts only the written certificate reaches a
server that serves it, by IP and by a name given; a name not in it is refused."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path

import pytest

from dynamiccl.testing.certs import main, write_self_signed


def _handshake(crt: Path, key: Path, server_hostname: str) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    client_ctx = ssl.create_default_context(cafile=str(crt))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            # A client that refuses the certificate ends the handshake: nothing to serve.
            with (
                conn,
                contextlib.suppress(ssl.SSLError),
                server_ctx.wrap_socket(conn, server_side=True) as tls,
            ):
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(5)


def test_clients_verify_the_certificate_by_ip_and_by_given_name(tmp_path: Path) -> None:
    crt, key = write_self_signed(tmp_path / "tls", ("ingest.test",))
    assert key.stat().st_mode & 0o077 == 0  # the key is the owner's alone
    _handshake(crt, key, "127.0.0.1")
    _handshake(crt, key, "ingest.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(crt, key, "other.test")


def test_the_command_writes_both_files_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(tmp_path / "out"), "10.0.0.7"])
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "out" / "tls.crt"), str(tmp_path / "out" / "tls.key")]
    with pytest.raises(SystemExit):
        main([])

"""dynamiccl.testing.ports: the port it gives can be served on at once."""

from __future__ import annotations

import socket

from dynamiccl.testing.ports import free_port


def test_a_server_binds_and_serves_on_the_free_port() -> None:
    port = free_port()
    with (
        socket.create_server(("127.0.0.1", port)) as server,
        socket.create_connection(("127.0.0.1", port), timeout=5) as client,
    ):
        conn, _ = server.accept()
        with conn:
            client.sendall(b"x")
            assert conn.recv(1) == b"x"

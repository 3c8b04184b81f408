"""The demo's port check against a real listening socket on loopback."""

from __future__ import annotations


def test_demo_port_check_sees_a_listener_not_a_closed_scrape() -> None:
    """The demo says 9464 is taken only when something listens there: the TIME_WAIT left by
    the previous run's scrapes does not stop the exporter (it binds with SO_REUSEADDR)."""
    import socket

    from rlmon.commands.demo import _port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not _port_free(port)  # listening: taken
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its port is left in TIME_WAIT
    client.close()
    server.close()
    assert _port_free(port)

"""The Host check of the exporter's server (issue 40, E14 and E15): every path answers only the
names of this server (DNS rebinding must not read run names and values from ``/metrics``), the
header is parsed strictly, and what scrapers and probes send still works. Requests go over a
real loopback socket, with the Host header written by hand (or left out)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest

from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.host_check import HostCheck, host_of
from rlmon.service.export.http import MetricsServer, serve_metrics


def raw_get(port: int, path: str, host: str | None, address: str = "127.0.0.1") -> int:
    """The status of one HTTP/1.1 GET with exactly this Host header (None: no Host at all)."""
    head = f"GET {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "") + \
        "Connection: close\r\n\r\n"
    with socket.create_connection((address, port), timeout=10) as conn:
        conn.sendall(head.encode("latin-1"))
        reply = b""
        while b"\r\n" not in reply:
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.fixture
def served() -> Iterator[MetricsServer]:
    server = serve_metrics(MetricsState(), port=0, host="127.0.0.1",
                           hosts=HostCheck("127.0.0.1", ["rlmon.example.com"]))
    yield server
    server.close()


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/", "/api/runs"])
def test_every_path_checks_the_host(served: MetricsServer, path: str) -> None:
    port = served.port
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io",
                 f"[::1]evil.example:{port}", "localhost:evil", "10.9.8.7", f"10.9.8.7:{port}",
                 "[2001:db8::1]", "::1", "localhost, attacker.example", "", None):
        assert raw_get(port, path, host) == 421, (path, host)
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST.",
                 f"[::1]:{port}", "127.0.0.2", "rlmon.example.com", f"rlmon.example.com.:{port}"):
        assert raw_get(port, path, host) != 421, (path, host)


def test_scrapers_reach_metrics_by_the_address_they_connect_to() -> None:
    """Bound to every interface (a pod), Prometheus and a kubelet probe send the target's
    ip:port: the address the request arrived on is answered, another address is not."""
    server = serve_metrics(MetricsState(), port=0, host="0.0.0.0")
    try:
        port = server.port
        assert raw_get(port, "/metrics", f"127.0.0.1:{port}") == 200
        assert raw_get(port, "/healthz", f"127.0.0.1:{port}") == 200
        assert raw_get(port, "/metrics", f"192.0.2.10:{port}") == 421
    finally:
        server.close()
    check = HostCheck("0.0.0.0")
    assert check.allows("10.1.2.3:9464", arrived_on="10.1.2.3")
    assert check.allows("[fd00::5]:9464", arrived_on="fd00::5")
    assert not check.allows("10.1.2.4:9464", arrived_on="10.1.2.3")
    assert not check.allows("10.1.2.3:9464")  # where it arrived is not known: not answered
    # a published container port scraped at the host's address: named in allowed_hosts
    mapped = HostCheck("0.0.0.0", ["192.168.1.10"])
    assert mapped.allows("192.168.1.10:9464", arrived_on="172.17.0.2")
    assert not check.allows("192.168.1.10:9464", arrived_on="172.17.0.2")
    bound = HostCheck("10.1.2.3")  # bound to one address: that one, and loopback
    assert bound.allows("10.1.2.3:9464") and bound.allows("127.0.0.1")
    assert not bound.allows("10.1.2.4")


@pytest.mark.parametrize(("header", "parsed"), [
    ("localhost", "localhost"), ("LocalHost:9464", "localhost"), ("rlmon.example.com.", "rlmon.example.com"),
    ("127.0.0.1:1", ipaddress.ip_address("127.0.0.1")), ("[::1]", ipaddress.ip_address("::1")),
    ("[::ffff:127.0.0.1]:80", ipaddress.ip_address("127.0.0.1")),
    ("[::1]evil.example", None), ("[::1]:evil", None), ("[::1", None), ("[evil.example]", None),
    ("localhost:evil", None), ("localhost:", None), ("localhost:99999", None), ("localhost:0", None),
    ("localhost:80:80", None), ("::1", None), ("", None), (None, None), ("a b", None),
    ("evil.example/x", None), ("evil.example@localhost", None), ("0x7f.1", None),
    ("127.1", None), ("0177.0.0.1", None), ("2130706433", None), ("-bad.example", None),
    ("a..b", None), ("x" * 300, None), ("localhost,evil.example", None),
])
def test_the_parser_takes_only_well_formed_hosts(header: str | None, parsed: object) -> None:
    assert host_of(header) == parsed

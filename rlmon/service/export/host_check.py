"""Which ``Host`` headers the exporter's server answers, on every path (``/metrics``,
``/healthz``, the run page and ``/api/``): DNS rebinding, where a web page of another site points
its own name at this machine, must not read run names and values.

A header is parsed strictly (RFC 9110: a name, an IPv4 address or a bracketed IPv6 address, then
at most ``:port`` in digits); anything else, or no header at all, is refused. The names answered
to are ``localhost``, the configured names (``exporter.allowed_hosts``, ``public_url``'s host)
and, bound beyond loopback, this machine's names. An IP literal is answered when it is a
loopback address, the bound address, or the address the request arrived on (what Prometheus
and a kubelet probe send: the target's ``ip:port``); those name this machine, never a site of
someone else's. The port is not checked (a proxy or ``kubectl port-forward`` shows another).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

__all__ = ["REFUSED", "HostCheck", "host_of"]

REFUSED = (b"rlmon: this server answers only its own names (localhost, a loopback address, the "
           b"address it was reached on, public_url's host, or a name in exporter.allowed_hosts)\n")

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _port_ok(rest: str) -> bool:
    """``rest`` is nothing or ``:port`` with a port in 1..65535."""
    if not rest:
        return True
    return rest[0] == ":" and bool(_PORT.match(rest[1:])) and 0 < int(rest[1:]) <= 65_535


def _address(text: str) -> IpAddress | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip


def host_of(header: str | None) -> str | IpAddress | None:
    """The host a ``Host`` header names: an IP address, or a name (lower case, without a
    trailing dot); None when the header is missing or malformed (``[::1]evil.example``,
    ``localhost:evil``, a bare IPv6 address, two headers joined by a comma, an address in a
    form browsers never send such as ``0x7f.1``)."""
    if not header:
        return None
    text = header.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not _port_ok(text[end + 1:]):
            return None
        inner = text[1:end]
        ip = _address(inner) if ":" in inner else None
        return ip
    name, colon, port = text.partition(":")
    if colon and not _port_ok(colon + port):
        return None
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > 253:
        return None
    if re.fullmatch(r"[0-9.]+", name):  # only an IPv4 address in its dotted form
        found = _address(name)
        return found if isinstance(found, ipaddress.IPv4Address) else None
    if re.fullmatch(r"[0-9]+|0x[0-9a-f]*", name.rsplit(".", 1)[-1]):
        return None  # a URL parser reads a name ending in a number as an IPv4 address
    return name if _NAME.match(name) else None


class HostCheck:
    """The allow-list of one server: ``bound`` is the address it listens on, ``names`` the
    configured names (``allowed_hosts``, ``public_url``'s host)."""

    def __init__(self, bound: str, names: Iterable[str] = ()) -> None:
        self.names = {n.lower().rstrip(".") for n in names if n} | {"localhost"}
        self.addresses: set[IpAddress] = set()
        named = {n for n in self.names if _address(n) is not None}
        self.addresses |= {a for a in map(_address, named) if a is not None}
        bound_ip = _address(bound.strip("[]"))
        if bound_ip is not None and not bound_ip.is_unspecified:
            self.addresses.add(bound_ip)
        loopback = bound == "localhost" or (bound_ip is not None and bound_ip.is_loopback)
        if not loopback:
            self.names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
            if bound_ip is None and bound not in ("", "localhost"):
                self.names.add(bound.lower().rstrip("."))

    def allows(self, header: str | None, arrived_on: str | None = None) -> bool:
        """Whether to answer a request with this ``Host`` header that reached the server at
        ``arrived_on`` (the connection's local address, when known)."""
        host = host_of(header)
        if host is None:
            return False
        if isinstance(host, str):
            return host in self.names
        if host.is_loopback or host in self.addresses:
            return True
        local = _address(arrived_on or "")
        return local is not None and host == local

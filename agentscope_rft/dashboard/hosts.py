"""Which names are this machine's loopback: the dashboard binds there by default and serves open
reads only to requests addressed to such a name."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, without a port) names this machine's loopback."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always loopback
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port (`[::1]:8765` -> `::1`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header

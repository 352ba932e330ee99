"""Which upstreams a worker may dial: an allow-list, and never a link-local or metadata address.

A START carries a URL from outside; without this a caller could point the fleet at the
instance metadata service (169.254.169.254) or any internal host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..validation import check_ws_url

DEFAULT_PORTS = {"ws": 80, "wss": 443}
# Cloud metadata endpoints that are not all link-local (AWS IPv6, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


class UpstreamRefused(ValueError):
    """The URL is not one this worker may dial; the message says why."""


@dataclass(frozen=True)
class AllowedUpstream:
    """One allow-list entry: ``scheme://host[:port]``; ``*.`` prefixes a domain wildcard and a
    missing port (or ``*``) allows any port."""

    scheme: str
    host: str
    port: int | None

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if scheme != self.scheme or (self.port is not None and port != self.port):
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host


@dataclass(frozen=True)
class UpstreamPolicy:
    """The allow-list, checked on every START and again on every (re)connect."""

    allowed: tuple[AllowedUpstream, ...]

    @classmethod
    def parse(cls, field: str, text: str) -> UpstreamPolicy:
        """Comma-separated entries, e.g. ``wss://*.feeds.example.com,ws://127.0.0.1:8765``."""
        entries = []
        for raw in filter(None, (part.strip() for part in text.split(","))):
            scheme, _, rest = raw.partition("://")
            host, _, port = rest.partition(":")
            if scheme not in DEFAULT_PORTS or not host or "/" in rest:
                raise ValueError(f"{field}: {raw!r} is not scheme://host[:port] with ws or wss")
            if port in ("", "*"):
                entries.append(AllowedUpstream(scheme, host.lower(), None))
            elif port.isdigit() and 0 < int(port) < 65536:
                entries.append(AllowedUpstream(scheme, host.lower(), int(port)))
            else:
                raise ValueError(f"{field}: {raw!r} has an invalid port")
        if not entries:
            raise ValueError(f"{field}: no entries")
        return cls(tuple(entries))

    def check(self, url: str) -> tuple[str, int]:
        """The URL's host and port if allowed; :class:`UpstreamRefused` otherwise."""
        try:
            check_ws_url("ws_url", url)
        except ValueError as exc:
            raise UpstreamRefused(str(exc)) from None
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or DEFAULT_PORTS[parts.scheme]
        if not any(entry.matches(parts.scheme, host, port) for entry in self.allowed):
            raise UpstreamRefused(f"ws_url: {parts.scheme}://{host}:{port} is not allow-listed")
        return host, port

    async def resolve(self, url: str) -> tuple[str, int]:
        """Check the URL, resolve its host, and return an address that is safe to dial.

        The worker connects to the address returned here (not the name again), so a DNS answer
        that changes between check and connect cannot lead it somewhere else.
        """
        host, port = self.check(url)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        for address in addresses:
            if address.is_link_local or address in METADATA_ADDRESSES or address.is_multicast:
                raise UpstreamRefused(f"ws_url: {host} resolves to forbidden address {address}")
        if not addresses:
            raise UpstreamRefused(f"ws_url: {host} does not resolve")
        return str(addresses[0]), port

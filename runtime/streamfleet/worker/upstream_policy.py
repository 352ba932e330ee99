"""Which upstreams a worker may dial: an allow-list, and only globally routable addresses,
however they are spelled.

A START carries a URL from outside; without this a caller could point the fleet at the
instance metadata service (169.254.169.254) or any internal host. The URL's host is first
reduced to one canonical ASCII string (:func:`~streamfleet.validation.canonical_host`: IDNA,
lower case, no trailing dot, nothing a resolver would cut short), and that very string is
matched against the list and resolved. Every address it resolves to must be globally routable:
loopback, private (RFC 1918, ``fc00::/7`` with ``fd00:ec2::/64``), shared (``100.64.0.0/10``),
benchmarking (``198.18.0.0/15``), link-local, multicast, unspecified and reserved addresses are
refused, and so are the metadata endpoints. The one exception is an allow-list entry that names
an IP literal (``ws://127.0.0.1:8765`` in local mode): a URL naming that exact literal may be
dialled, except a metadata, unspecified or multicast address. Whoever controls DNS under an
allow-listed wildcard controls the addresses a name resolves to, so every resolved address is
checked, and in every spelling that reaches the same IPv4 host: an IPv4-mapped IPv6 address
(``::ffff:169.254.169.254``, which a dual-stack socket dials as 169.254.169.254), the deprecated
IPv4-compatible form (``::169.254.169.254``), NAT64's well-known prefix (``64:ff9b::/96``) and
6to4 (``2002::/16``) are judged by the IPv4 address they carry. The unspecified addresses
(``0.0.0.0``, ``::``) are refused too: connecting to them reaches the local host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..validation import canonical_host, check_ws_url

DEFAULT_PORTS = {"ws": 80, "wss": 443}
# Cloud metadata endpoints that are not all link-local (AWS IPv6, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
# AWS's IPv6 instance-metadata network, all of it (not only its ::254 address).
METADATA_NETWORK = ipaddress.ip_network("fd00:ec2::/64")
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses the host resolves to, as strings; injectable for tests.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (``getaddrinfo``, TCP)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64_PREFIX or (address in IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def forbidden_reason(address: IPAddress, *, literal_allowed: bool = False) -> str | None:
    """Why a worker must not dial ``address`` (``None``: it may), judging an IPv6 address that
    carries an IPv4 address by both. ``literal_allowed``: the allow-list names this very
    address, so only the classes no entry can open are refused."""
    embedded = embedded_ipv4(address)
    for candidate in (address, embedded):
        if candidate is None:
            continue
        if candidate.is_unspecified:
            return "unspecified"
        if candidate in METADATA_ADDRESSES or candidate in METADATA_NETWORK:
            return "a metadata service"
        if candidate.is_link_local:
            return "link-local"
        if candidate.is_multicast:
            return "multicast"
    # An IPv6 address that carries an IPv4 one reaches that IPv4 host: judged by it.
    if not literal_allowed and not (embedded or address).is_global:
        return "not globally routable"
    return None


_NOT_IN_ENTRY = frozenset("/@?#\\ \t\r\n")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
        """Comma-separated entries, e.g. ``wss://*.feeds.example.com,ws://127.0.0.1:8765``. A
        wildcard names a domain of at least two labels; hosts are kept in canonical form."""
        entries = []
        for raw in filter(None, (part.strip() for part in text.split(","))):
            scheme, _, rest = raw.partition("://")
            host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
            if scheme not in DEFAULT_PORTS or not host or any(c in rest for c in _NOT_IN_ENTRY):
                raise ValueError(f"{field}: {raw!r} is not scheme://host[:port] with ws or wss")
            wildcard = host.startswith("*.")
            try:
                canonical = canonical_host(field, host[2:] if wildcard else host)
            except ValueError:
                raise ValueError(f"{field}: {raw!r} does not name a valid host") from None
            if wildcard and (canonical.count(".") < 1 or _is_ip(canonical)):
                raise ValueError(
                    f"{field}: {raw!r}: a wildcard must name a domain of two labels or more"
                )
            host = f"*.{canonical}" if wildcard else canonical
            if port in ("", "*"):
                entries.append(AllowedUpstream(scheme, host, None))
            elif port.isdigit() and 0 < int(port) < 65536:
                entries.append(AllowedUpstream(scheme, host, int(port)))
            else:
                raise ValueError(f"{field}: {raw!r} has an invalid port")
        if not entries:
            raise ValueError(f"{field}: no entries")
        return cls(tuple(entries))

    def check(self, url: str) -> tuple[str, int]:
        """The URL's canonical host and its port if allowed (the very host to resolve);
        :class:`UpstreamRefused` otherwise."""
        try:
            check_ws_url("ws_url", url)
            parts = urlsplit(url)
            host = canonical_host("ws_url", parts.hostname or "")
        except ValueError as exc:
            raise UpstreamRefused(str(exc)) from None
        port = parts.port or DEFAULT_PORTS[parts.scheme]
        if not any(entry.matches(parts.scheme, host, port) for entry in self.allowed):
            raise UpstreamRefused(f"ws_url: {parts.scheme}://{host}:{port} is not allow-listed")
        return host, port

    async def resolve(self, url: str, *, resolver: Resolver | None = None) -> tuple[str, int]:
        """Check the URL, resolve its host, and return an address that is safe to dial.

        The worker connects to the address returned here (not the name again), so a DNS answer
        that changes between check and connect cannot lead it somewhere else. One forbidden
        address among the answers refuses the URL (the next resolution could pick it). An
        IPv4-mapped answer is returned as its IPv4 address: the host a dual-stack socket would
        reach, and the one that was checked.
        """
        host, port = self.check(url)
        # An entry naming this very IP literal opens it (local mode's loopback upstream).
        literal_allowed = _is_ip(host) and any(entry.host == host for entry in self.allowed)
        answers = await (resolver or system_resolver)(host, port)
        addresses: list[IPAddress] = []
        for text in answers:
            try:
                address = ipaddress.ip_address(str(text).partition("%")[0])
            except ValueError:
                raise UpstreamRefused(
                    f"ws_url: {host} resolves to {text!r}, not an address"
                ) from None
            reason = forbidden_reason(address, literal_allowed=literal_allowed)
            if reason is not None:
                raise UpstreamRefused(
                    f"ws_url: {host} resolves to forbidden address {address} ({reason})"
                )
            addresses.append(address)
        if not addresses:
            raise UpstreamRefused(f"ws_url: {host} does not resolve")
        first = addresses[0]
        if isinstance(first, ipaddress.IPv6Address) and first.ipv4_mapped is not None:
            return str(first.ipv4_mapped), port
        return str(first), port

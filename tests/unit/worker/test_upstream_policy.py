"""The worker's upstream address check, against every spelling of a forbidden address.

The resolver is injected (no DNS): each test answers with exactly the addresses a hostile DNS
server under an allow-listed wildcard could return for ``feed.example.com``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streamfleet.worker.upstream_policy import UpstreamPolicy, UpstreamRefused

POLICY = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "wss://*.example.com,ws://127.0.0.1:8765")
URL = "wss://feed.example.com/stream"


class FakeResolver:
    """Answers every lookup with ``answers`` and records what it was asked."""

    def __init__(self, *answers: str) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        return self.answers


FORBIDDEN = {
    # the metadata service, as DNS may spell it
    "169.254.169.254": "a metadata service",
    "::ffff:169.254.169.254": "a metadata service",  # IPv4-mapped: dialled as 169.254.169.254
    "::ffff:a9fe:a9fe": "a metadata service",  # the same, in hex
    "::169.254.169.254": "a metadata service",  # IPv4-compatible (deprecated)
    "64:ff9b::169.254.169.254": "a metadata service",  # NAT64 well-known prefix
    "2002:a9fe:a9fe::1": "a metadata service",  # 6to4
    "fd00:ec2::254": "a metadata service",  # EC2's IPv6 metadata endpoint
    "100.100.100.200": "a metadata service",
    "::ffff:100.100.100.200": "a metadata service",
    # the local host through the unspecified address
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "::ffff:0.0.0.0": "unspecified",
    # link-local (the ECS task metadata endpoint is 169.254.170.2) and multicast
    "169.254.170.2": "link-local",
    "::ffff:169.254.170.2": "link-local",
    "fe80::1": "link-local",
    "fe80::1%eth0": "link-local",
    "224.0.0.1": "multicast",
    "::ffff:224.0.0.1": "multicast",
    "ff02::1": "multicast",
}


@pytest.mark.parametrize(("answer", "reason"), sorted(FORBIDDEN.items()))
async def test_every_spelling_of_a_forbidden_address_is_refused(answer, reason):
    resolver = FakeResolver(answer)
    with pytest.raises(UpstreamRefused, match=rf"forbidden address .*\({reason}\)$"):
        await POLICY.resolve(URL, resolver=resolver)
    assert resolver.asked == [("feed.example.com", 443)]


async def test_one_forbidden_answer_among_good_ones_refuses_the_url():
    # The next connection attempt could pick the bad one: the URL is refused outright.
    resolver = FakeResolver("93.184.216.34", "::ffff:169.254.169.254")
    with pytest.raises(UpstreamRefused, match="forbidden address"):
        await POLICY.resolve(URL, resolver=resolver)


@pytest.mark.parametrize(
    ("answers", "dialled"),
    [
        (("93.184.216.34",), "93.184.216.34"),
        # A mapped answer is dialled as the IPv4 address that was checked.
        (("::ffff:93.184.216.34", "93.184.216.35"), "93.184.216.34"),
        (("2606:2800:220:1:248:1893:25c8:1946",), "2606:2800:220:1:248:1893:25c8:1946"),
    ],
)
async def test_public_addresses_are_dialled_by_address(answers, dialled):
    assert await POLICY.resolve(URL, resolver=FakeResolver(*answers)) == (dialled, 443)


async def test_an_allow_listed_literal_keeps_working():
    resolver = FakeResolver("127.0.0.1")
    assert await POLICY.resolve("ws://127.0.0.1:8765/", resolver=resolver) == ("127.0.0.1", 8765)


async def test_a_name_that_does_not_resolve_is_refused():
    with pytest.raises(UpstreamRefused, match="does not resolve"):
        await POLICY.resolve(URL, resolver=FakeResolver())


async def test_an_answer_that_is_not_an_address_is_refused():
    with pytest.raises(UpstreamRefused, match="not an address"):
        await POLICY.resolve(URL, resolver=FakeResolver("feed.example.com"))


async def test_a_url_outside_the_allow_list_is_refused_before_any_lookup():
    resolver = FakeResolver("93.184.216.34")
    with pytest.raises(UpstreamRefused, match="not allow-listed"):
        await POLICY.resolve("wss://example.org/", resolver=resolver)
    assert resolver.asked == []


# --- An allow-list of wildcard hosts ---


FEEDS = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "wss://*.feeds.example.com,ws://127.0.0.1:8765")


@pytest.mark.parametrize(
    "url", ["wss://a.feeds.example.com/x", "wss://b.c.feeds.example.com:9443/y?z=1"]
)
def test_allow_listed_urls_pass(url):
    FEEDS.check(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("wss://feeds.example.com/x", "not allow-listed"),  # the wildcard needs a subdomain
        ("wss://evil.com/?x=.feeds.example.com", "not allow-listed"),
        ("ws://a.feeds.example.com/x", "not allow-listed"),  # wrong scheme
        ("ws://127.0.0.1:8766/x", "not allow-listed"),  # wrong port
        ("ws://169.254.169.254/latest", "not allow-listed"),
        ("http://127.0.0.1:8765/x", "scheme"),
    ],
)
def test_other_urls_are_refused_with_a_reason(url, reason):
    with pytest.raises(UpstreamRefused, match=reason):
        FEEDS.check(url)


async def test_a_name_resolving_to_a_link_local_address_is_refused():
    policy = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://169.254.169.254")
    with pytest.raises(UpstreamRefused, match="forbidden address"):
        await policy.resolve("ws://169.254.169.254/latest/meta-data")


async def test_an_allowed_name_resolves_to_the_address_to_dial():
    assert await FEEDS.resolve("ws://127.0.0.1:8765/streams/a") == ("127.0.0.1", 8765)

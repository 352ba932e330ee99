"""The worker's upstream address check, against every spelling of a forbidden address.

The resolver is injected (no DNS): each test answers with exactly the addresses a hostile DNS
server under an allow-listed wildcard could return for ``feed.example.com``.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfleet.validation import canonical_host
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


# --- One canonical host, only global addresses, wildcards that name a domain ----------------------


@pytest.mark.parametrize(
    "url",
    [
        "wss://127.0.0.2\x00.example.com/",  # the C resolver stopped at the NUL: 127.0.0.2
        "wss://.example.com/",  # an empty label (IDNA raised UnicodeError in the worker)
        "wss://a..example.com/",
        "wss://under_score.example.com/",
        "wss://example.com\x7f/",
    ],
)
def test_a_host_that_is_no_valid_name_is_refused_before_anything_resolves(url):
    with pytest.raises(UpstreamRefused):
        POLICY.check(url)


def test_the_host_is_matched_and_resolved_in_one_canonical_spelling():
    assert POLICY.check("wss://Feed.Example.COM./s") == ("feed.example.com", 443)
    idna = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "wss://*.xn--bcher-kva.de")
    assert idna.check("wss://live.bücher.de/") == ("live.xn--bcher-kva.de", 443)
    with pytest.raises(UpstreamRefused, match="not allow-listed"):
        POLICY.check("wss://db.internal.corp./")  # a trailing dot names no other domain


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("127.0.0.1", "not globally routable"),
        ("10.1.2.3", "not globally routable"),
        ("172.16.0.1", "not globally routable"),
        ("192.168.1.1", "not globally routable"),
        ("100.64.0.1", "not globally routable"),  # shared address space
        ("198.18.0.1", "not globally routable"),  # benchmarking
        ("::1", "not globally routable"),
        ("fc00::1", "not globally routable"),
        ("::ffff:10.1.2.3", "not globally routable"),
        ("fd00:ec2::1", "a metadata service"),  # the whole of EC2's IPv6 metadata network
    ],
)
async def test_a_name_that_resolves_to_an_internal_address_is_refused(answer, reason):
    """An allow-listed name resolving to loopback was dialled, and the worker stored what an
    internal WebSocket service sent."""
    with pytest.raises(UpstreamRefused, match=rf"\({reason}\)$"):
        await POLICY.resolve(URL, resolver=FakeResolver(answer))


async def test_an_entry_naming_an_ip_literal_opens_that_literal_only():
    """Local mode's ws://127.0.0.1:8765: the exact literal, never a name that resolves to it."""
    assert await POLICY.resolve("ws://127.0.0.1:8765/s", resolver=FakeResolver("127.0.0.1")) == (
        "127.0.0.1",
        8765,
    )
    loopback_name = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://local.example.com:8765")
    with pytest.raises(UpstreamRefused, match="not globally routable"):
        await loopback_name.resolve(
            "ws://local.example.com:8765/s", resolver=FakeResolver("127.0.0.1")
        )


@pytest.mark.parametrize(
    "entry",
    [
        "wss://*.",  # allowed every host written with a trailing dot
        "wss://*.com",  # one label: a whole top-level domain
        "wss://*.example.com/path",
        "wss://user@*.example.com",
        "wss://*.example.com?x",
        "wss://*.example.com#x",
        "wss://*.exa\\mple.com",
        "wss://*.1.2.3.4",
    ],
)
def test_an_entry_that_names_no_real_domain_is_refused_naming_the_field(entry):
    with pytest.raises(ValueError, match=r"^ALLOWED_UPSTREAMS: "):
        UpstreamPolicy.parse("ALLOWED_UPSTREAMS", entry)


# Labels from pieces a hostile START could combine: letters, digits, dots, hyphens, an
# underscore, a NUL, DEL, a space, non-ASCII letters, IDNA prefixes.
hosts = st.lists(
    st.sampled_from([*"abcXYZ019-._.", "\x00", "\x7f", " ", "ü", "Ä", "xn--", "xn--bcher-kva"]),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(hosts)
async def test_the_matched_host_is_the_resolved_host_for_every_accepted_url(label):
    url = f"wss://{label}.example.com/s"
    try:
        host, port = POLICY.check(url)
    except UpstreamRefused:
        return
    resolver = FakeResolver("93.184.216.34")
    await POLICY.resolve(url, resolver=resolver)
    assert resolver.asked == [(host, port)]
    assert host == canonical_host("ws_url", urlsplit(url).hostname or "")
    assert host.endswith(".example.com") and host.isascii() and "\x00" not in host

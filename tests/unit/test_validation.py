"""Bad input gets a ValueError that names the field, before anything is written."""

from __future__ import annotations

import math

import pytest

from streamfleet import model
from streamfleet.lease import LeaseTiming
from streamfleet.validation import check_id, check_positive_seconds, check_ws_url


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("x" * 513, "longer than 512 bytes"),
        ("é" * 257, "longer than 512 bytes"),
        ("has space", "only letters"),
        ("slash/inside", "only letters"),
        ("CONN#nested", "only letters"),
        (42, "expected a string"),
        (None, "expected a string"),
    ],
)
def test_bad_ids_are_refused_with_the_field_name(value, message):
    with pytest.raises(ValueError, match=rf"^connection_id: .*{message}"):
        check_id("connection_id", value)


@pytest.mark.parametrize("value", ["a", "meeting-123", "A.b_c:d-e", "x" * 512])
def test_good_ids_pass(value):
    assert check_id("connection_id", value) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://host/x", "scheme must be ws:// or wss://"),
        ("ftp://host", "scheme"),
        ("ws://", "has no host"),
        ("ws:///path", "has no host"),
        ("ws://host:notaport/x", "not a valid URL"),
        ("ws://host/a b", "whitespace"),
        ("ws://h/" + "x" * 2100, "longer than"),
        (["ws://host"], "expected a string"),
    ],
)
def test_bad_ws_urls_are_refused(value, message):
    with pytest.raises(ValueError, match=rf"^ws_url: .*{message}"):
        check_ws_url("ws_url", value)


@pytest.mark.parametrize("value", ["ws://127.0.0.1:8080/s?x=1", "wss://feed.example.com/a"])
def test_good_ws_urls_pass(value):
    assert check_ws_url("ws_url", value) == value


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "5"])
def test_durations_must_be_positive_finite_numbers(value):
    with pytest.raises(ValueError, match=r"^LEASE_SECONDS: "):
        check_positive_seconds("LEASE_SECONDS", value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": -3}, "lease_seconds"),
        ({"heartbeat_seconds": 0}, "heartbeat_seconds"),
        ({"max_clock_skew_seconds": -1}, "max_clock_skew_seconds"),
        ({"lease_seconds": 1.4, "heartbeat_seconds": 0.1}, "lease_seconds"),  # no window left
        ({"lease_seconds": 20, "heartbeat_seconds": 10}, "heartbeat_seconds"),  # not well below
    ],
)
def test_lease_timing_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        LeaseTiming(**kwargs)


def test_the_holder_deadline_leaves_skew_and_margin_before_expiry():
    timing = LeaseTiming(
        lease_seconds=20, heartbeat_seconds=5, max_clock_skew_seconds=1, safety_margin_seconds=0.5
    )
    assert timing.holder_deadline(100.0) == pytest.approx(118.5)
    assert not timing.is_expired_for_taker(expires_at_ms=10_000, now_wall_ms=11_000)
    assert timing.is_expired_for_taker(expires_at_ms=10_000, now_wall_ms=11_001)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "body: not JSON"),
        ("[1]", "not a JSON object"),
        ('{"pk": 5}', "pk: expected"),
        ('{"pk": "SESSION#x"}', "pk: expected"),
    ],
)
def test_bad_notifications_are_refused(body, message):
    with pytest.raises(ValueError, match=message):
        model.parse_notification(body)


def test_notification_round_trip():
    pk = model.connection_pk("meeting-1")
    assert model.parse_notification(model.notification_body(pk)) == pk
    assert model.connection_id_of(pk) == "meeting-1"


def test_an_orphan_notification_says_so_and_an_ordinary_one_does_not():
    pk = model.connection_pk("meeting-1")
    assert model.parse_notification(model.notification_body(pk, orphan=True)) == pk
    assert model.is_orphan_notification(model.notification_body(pk, orphan=True))
    assert not model.is_orphan_notification(model.notification_body(pk))
    assert not model.is_orphan_notification("not json")

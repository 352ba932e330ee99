"""The event router Lambda against moto's server (DynamoDB and SQS): the real handler, real
conditional writes, real queue. Nothing is mocked in-process.

Every bad request must be a 400 naming the field and must leave the table and the queue exactly
as they were; a property test throws arbitrary bodies at the handler and then checks that the
table holds only well-formed rows and the queue only notifications for existing rows.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfleet import event_router, model
from streamfleet.aws import AsyncClient
from streamfleet.event_router import BadRequest, StartEvent, parse_event
from streamfleet.lease import Lease, LeaseStore, LeaseTiming
from streamfleet.request_body import BodyRefused, decode_body
from streamfleet.validation import check_id
from streamfleet_dev.emulator.http_adapter import make_server, serve_in_thread
from tests.router_support import POLICY, URL, Router, proxy_event

OTHER_URL = "ws://127.0.0.1:8765/b"


# --- Harness --------------------------------------------------------------------------------


async def acquire(table: str, connection_id: str, worker_id: str = "w1") -> Lease:
    """Take the connection's lease as a worker would (its session stays live)."""
    client = AsyncClient("dynamodb")
    try:
        store = LeaseStore.create(
            table_name=table, worker_id=worker_id, timing=LeaseTiming(), dynamodb=client
        )
        await store.session.open()
        lease = await store.connections.acquire(model.connection_pk(connection_id))
        assert lease is not None
        return lease
    finally:
        client.close()


# --- START / STOP / GET ---------------------------------------------------------------------


def test_start_creates_the_row_and_sends_exactly_one_notification(router: Router):
    status, payload = router.start("c1")

    assert status == 201
    assert payload["connection_id"] == "c1"
    assert payload["outcome"] == "created"
    assert payload["notified"] is True
    assert payload["state"]["desired_state"] == "STARTED"
    assert payload["state"]["ws_url"] == URL
    assert payload["state"]["lease_owner"] is None
    row = router.row("c1")
    assert row["desired_state"] == "STARTED"
    assert row["ws_url"] == URL
    assert row[model.AWAITING_OWNER] == model.awaiting_owner_value(row[model.PK])
    assert router.drain() == [model.notification_body(model.connection_pk("c1"))]


def test_repeated_start_leaves_a_held_lease_alone_and_sends_nothing(router: Router):
    router.start("c1")
    router.drain()
    lease = asyncio.run(acquire(router.table, "c1"))
    before = router.row("c1")

    status, payload = router.start("c1")

    assert (status, payload["outcome"], payload["notified"]) == (200, "unchanged", False)
    after = router.row("c1")
    assert after == before
    assert after[model.LEASE_OWNER] == "w1"
    assert after[model.LEASE_VERSION] == lease.lease_version
    assert payload["state"]["lease_owner"] == "w1"
    assert payload["state"]["lease_version"] == lease.lease_version
    assert router.drain() == []
    assert router.queue_depth() == 0


def test_start_with_another_url_while_running_is_a_conflict(router: Router):
    router.start("c1")
    router.drain()
    before = router.row("c1")

    status, payload = router.start("c1", OTHER_URL)

    assert status == 409
    assert payload["outcome"] == "conflict"
    assert payload["field"] == "ws_url"
    assert payload["state"]["ws_url"] == URL
    assert router.row("c1") == before
    assert router.drain() == []


def test_stop_then_stop_again_then_restart(router: Router):
    router.start("c1")
    router.drain()

    status, payload = router.stop("c1")
    assert (status, payload["outcome"]) == (200, "stopped")
    assert router.row("c1")["desired_state"] == "STOPPED"
    assert model.AWAITING_OWNER not in router.row("c1")

    status, payload = router.stop("c1")
    assert (status, payload["outcome"]) == (200, "unchanged")
    assert router.drain() == []

    status, payload = router.start("c1", OTHER_URL)  # a STOPPED connection may change URL
    assert (status, payload["outcome"], payload["notified"]) == (200, "restarted", True)
    row = router.row("c1")
    assert (row["desired_state"], row["ws_url"]) == ("STARTED", OTHER_URL)
    assert router.drain() == [model.notification_body(model.connection_pk("c1"))]


def test_stop_of_a_held_connection_flags_its_owner_and_restart_sends_nothing(router: Router):
    router.start("c1")
    router.drain()
    lease = asyncio.run(acquire(router.table, "c1"))

    status, _ = router.stop("c1")
    assert status == 200
    assert router.row("c1")[model.STOP_REQUESTED_FOR] == "w1"

    # Still owned: the owner keeps it running, so nobody needs to be told to claim it.
    status, payload = router.start("c1")
    assert (status, payload["outcome"], payload["notified"]) == (200, "restarted", False)
    row = router.row("c1")
    assert row[model.LEASE_OWNER] == "w1"
    assert row[model.LEASE_VERSION] == lease.lease_version
    assert model.STOP_REQUESTED_FOR not in row
    assert router.drain() == []


def test_stop_of_an_unknown_connection_is_404(router: Router):
    status, payload = router.stop("nope")

    assert status == 404
    assert (payload["outcome"], payload["field"], payload["state"]) == (
        "not_found",
        "connection_id",
        None,
    )
    assert router.items() == []
    assert router.queue_depth() == 0


def test_get_returns_the_state(router: Router):
    router.start("feed:1")
    lease = asyncio.run(acquire(router.table, "feed:1"))

    status, payload = router.get("feed:1")

    assert status == 200
    assert payload["connection_id"] == "feed:1"
    state = payload["state"]
    assert state["desired_state"] == "STARTED"
    assert state["ws_url"] == URL
    assert state["lease_owner"] == "w1"
    assert state["lease_version"] == lease.lease_version
    assert state["last_seq"] is None  # never checkpointed: nothing stored yet
    assert isinstance(state["updated_at_ms"], int)
    assert "refused_reason" not in state


def test_get_shows_a_refusal(router: Router):
    router.start("c1")
    router.dynamodb.update_item(
        TableName=router.table,
        Key={"pk": {"S": model.connection_pk("c1")}},
        UpdateExpression="SET refused_reason = :r, desired_state = :s",
        ExpressionAttributeValues={":r": {"S": "ws_url: not allowed"}, ":s": {"S": "STOPPED"}},
    )

    status, payload = router.get("c1")

    assert status == 200
    assert payload["state"]["refused_reason"] == "ws_url: not allowed"
    assert payload["state"]["desired_state"] == "STOPPED"


def test_get_from_the_path_alone_and_percent_encoded(router: Router):
    router.start("feed:1")

    for path in ("/connections/feed:1", "/connections/feed%3A1", "/connections/feed:1/"):
        status, payload = router.call(proxy_event("GET", path, resource="/{proxy+}"))
        assert (status, payload["connection_id"]) == (200, "feed:1"), path


def test_get_unknown_is_404_and_bad_id_is_400(router: Router):
    status, payload = router.get("nope")
    assert (status, payload["field"]) == (404, "connection_id")

    for bad in ("a b", "a#b", "x" * 513, ""):
        status, payload = router.get(bad)
        assert (status, payload["field"]) == (400, "connection_id"), bad


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/events", 405),
        ("PUT", "/events", 405),
        ("POST", "/connections/c1", 405),
        ("DELETE", "/connections/c1", 405),
        ("GET", "/", 404),
        ("GET", "/connections", 404),
        ("GET", "/connections/a/b", 404),
        ("POST", "/event", 404),
    ],
)
def test_other_methods_and_paths(router: Router, method: str, path: str, status: int):
    got, payload = router.call(proxy_event(method, path, resource="/{proxy+}", body="{}"))

    assert got == status
    assert "error" in payload
    assert router.items() == []


def test_base64_encoded_body_is_decoded(router: Router):
    body = json.dumps({"event_type": "START", "connection_id": "b64", "ws_url": URL})

    status, _ = router.post(base64.b64encode(body.encode()).decode(), raw=True, is_base64=True)

    assert status == 201
    assert router.row("b64")["ws_url"] == URL


def test_one_log_record_per_request_without_url_or_body(
    router: Router, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger=event_router.__name__)
    secret_url = "wss://a.feeds.example.com/s?token=SECRET-TOKEN"
    router.start("c1", secret_url)
    router.post({"event_type": "START", "connection_id": "c2", "ws_url": "ws://evil:1/?k=SECRET"})
    router.post("SECRET not json", raw=True)

    records = [r for r in caplog.records if getattr(r, "event", None) == "request"]
    assert len(records) == 3
    assert [r.levelno for r in records] == [logging.INFO] * 3
    first = {
        "event": "request",
        "request_id": "test-request",
        "method": "POST",
        "route": "events",
        "event_type": "START",
        "connection_id": "c1",
        "outcome": "created",
        "status": 201,
    }
    assert {key: getattr(records[0], key, None) for key in first} == first
    assert isinstance(records[0].duration_ms, float)
    assert (records[1].status, records[1].error_field) == (400, "ws_url")
    assert (records[2].status, records[2].error_field) == (400, "body")
    logged = [f"{r.getMessage()} {json.dumps(r.__dict__, default=str)}" for r in caplog.records]
    assert "SECRET" not in "\n".join(logged)


# --- Bad input: 400 naming the field, nothing written ---------------------------------------

START_BODY = {"event_type": "START", "connection_id": "c1", "ws_url": URL}


def _start(**changes: Any) -> str:
    return json.dumps({**START_BODY, **changes})


def _without(name: str) -> str:
    return json.dumps({key: value for key, value in START_BODY.items() if key != name})


BAD_BODIES = [
    # (id, body, isBase64Encoded, field)
    ("missing", None, False, "body"),
    ("empty", "", False, "body"),
    ("not-json", "event_type=START", False, "body"),
    ("truncated-json", _start()[:-1], False, "body"),
    ("array", "[1, 2]", False, "body"),
    ("string", '"START"', False, "body"),
    ("null", "null", False, "body"),
    ("nan", '{"event_type": "STOP", "connection_id": "c1", "x": NaN}', False, "body"),
    ("deep", "[" * 3000 + "]" * 3000, False, "body"),
    ("too-large", _start() + " " * event_router.DEFAULT_MAX_BODY_BYTES, False, "body"),
    ("lone-surrogate-str", '{"event_type": "STOP", "connection_id": "\ud800"}', False, "body"),
    ("bad-base64", "not base64!!", True, "body"),
    ("base64-not-utf8", base64.b64encode(b"\xff\xfe{}").decode(), True, "body"),
    ("base64-not-json", base64.b64encode(b"hello").decode(), True, "body"),
    (
        "base64-too-large",
        base64.b64encode(b" " * (event_router.DEFAULT_MAX_BODY_BYTES + 1)).decode(),
        True,
        "body",
    ),
    ("no-event-type", _without("event_type"), False, "event_type"),
    ("lowercase-start", _start(event_type="start"), False, "event_type"),
    ("unknown-event-type", _start(event_type="RESTART"), False, "event_type"),
    ("event-type-number", _start(event_type=1), False, "event_type"),
    ("event-type-null", _start(event_type=None), False, "event_type"),
    ("no-connection-id", _without("connection_id"), False, "connection_id"),
    ("connection-id-number", _start(connection_id=7), False, "connection_id"),
    ("connection-id-empty", _start(connection_id=""), False, "connection_id"),
    ("connection-id-space", _start(connection_id="a b"), False, "connection_id"),
    ("connection-id-hash", _start(connection_id="CONN#x"), False, "connection_id"),
    ("connection-id-unicode", _start(connection_id="café"), False, "connection_id"),
    ("connection-id-513-bytes", _start(connection_id="x" * 513), False, "connection_id"),
    (
        "connection-id-surrogate",
        '{"event_type":"STOP","connection_id":"a\\udc00"}',
        False,
        "connection_id",
    ),
    ("no-ws-url", _without("ws_url"), False, "ws_url"),
    ("ws-url-null", _start(ws_url=None), False, "ws_url"),
    ("ws-url-list", _start(ws_url=[URL]), False, "ws_url"),
    ("ws-url-http", _start(ws_url="http://127.0.0.1:8765/"), False, "ws_url"),
    ("ws-url-no-host", _start(ws_url="ws:///x"), False, "ws_url"),
    ("ws-url-bad-port", _start(ws_url="ws://127.0.0.1:99999/"), False, "ws_url"),
    ("ws-url-space", _start(ws_url="ws://127.0.0.1:8765/a b"), False, "ws_url"),
    ("ws-url-nul", _start(ws_url="ws://127.0.0.1:8765/\x00"), False, "ws_url"),
    (
        "ws-url-surrogate",
        '{"event_type":"START","connection_id":"c","ws_url":"ws://127.0.0.1:8765/\\ud800"}',
        False,
        "ws_url",
    ),
    ("ws-url-not-allowed-port", _start(ws_url="ws://127.0.0.1:9999/"), False, "ws_url"),
    ("ws-url-metadata", _start(ws_url="ws://169.254.169.254/"), False, "ws_url"),
    ("ws-url-wrong-scheme", _start(ws_url="ws://x.feeds.example.com/"), False, "ws_url"),
    ("ws-url-bare-domain", _start(ws_url="wss://feeds.example.com/"), False, "ws_url"),
    ("unknown-field", _start(priority=1), False, "priority"),
    ("typo-field", _without("ws_url")[:-1] + ', "wsurl": "' + URL + '"}', False, "wsurl"),
    (
        "stop-with-url",
        json.dumps({"event_type": "STOP", "connection_id": "c1", "ws_url": URL}),
        False,
        "ws_url",
    ),
    (
        "duplicate-key",
        '{"event_type":"STOP","event_type":"START","connection_id":"c1"}',
        False,
        "event_type",
    ),
]


@pytest.mark.parametrize(
    ("body", "is_base64", "field"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_bad_bodies_are_400_naming_the_field_and_write_nothing(
    router: Router, body: str | None, is_base64: bool, field: str
):
    router.start("existing")
    router.drain()
    before = router.items()

    status, payload = router.post(body, raw=True, is_base64=is_base64)

    assert status == 400, payload
    assert payload["field"] == field
    assert payload["error"].startswith(f"{field}: ")
    assert router.items() == before
    assert router.queue_depth() == 0
    assert router.drain() == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TABLE_NAME", None),
        ("QUEUE_URL", None),
        ("ALLOWED_UPSTREAMS", None),
        ("TABLE_NAME", "  "),
        ("TABLE_NAME", "a b"),
        ("QUEUE_URL", "intake"),
        ("ALLOWED_UPSTREAMS", "http://127.0.0.1:8765"),
        ("ALLOWED_UPSTREAMS", "ws://127.0.0.1:0"),
        ("MAX_BODY_BYTES", "abc"),
        ("MAX_BODY_BYTES", "0"),
        ("MAX_BODY_BYTES", "-5"),
    ],
)
def test_missing_or_invalid_env_var_is_500_naming_it(
    router: Router, monkeypatch: pytest.MonkeyPatch, variable: str, value: str | None
):
    if value is None:
        monkeypatch.delenv(variable)
    else:
        monkeypatch.setenv(variable, value)

    for request in (
        lambda: router.start("c1"),
        lambda: router.stop("c1"),
        lambda: router.get("c1"),
    ):
        status, payload = request()
        assert status == 500
        assert payload["variable"] == variable
        assert variable in payload["error"]
    assert router.items() == []
    assert router.queue_depth() == 0


def test_max_body_bytes_is_honoured(router: Router, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MAX_BODY_BYTES", "64")
    body = _start()
    assert len(body) > 64

    status, payload = router.post(body, raw=True)

    assert (status, payload["field"]) == (400, "body")
    assert router.items() == []


# --- Property: whatever arrives, the table and queue stay well formed -----------------------

IDS = ["a", "b", "c.d", "x:y-z_1"]
ALLOWED_URLS = [URL, OTHER_URL + "?x=1", "wss://s.feeds.example.com/q"]
BAD_URLS = [
    "ws://127.0.0.1:9999/",
    "http://127.0.0.1:8765/",
    "wss://feeds.example.com/",
    "ws://169.254.169.254/",
    "ws://127.0.0.1:8765/ a",
    "ws://127.0.0.1:8765/\x00",
    "ws://[::1",
    "",
]
PROPERTY_MAX_BODY_BYTES = 400

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
event_types = st.sampled_from(["START", "STOP", "start", "Stop", "", "RESTART"]) | json_values
connection_ids = (
    st.sampled_from(IDS)
    | st.from_regex(r"[A-Za-z0-9._:\-]{1,8}", fullmatch=True)
    | st.text(max_size=12)
    | json_values
)
ws_urls = st.sampled_from(ALLOWED_URLS) | st.sampled_from(BAD_URLS) | st.text(max_size=24)
# A few known ids so STARTs and STOPs meet again; fresh ones so CREATED keeps happening.
valid_ids = st.sampled_from(IDS) | st.from_regex(r"[A-Za-z0-9._:\-]{1,8}", fullmatch=True)
valid_objects = st.one_of(
    st.fixed_dictionaries(
        {
            "event_type": st.just("START"),
            "connection_id": valid_ids,
            "ws_url": st.sampled_from(ALLOWED_URLS),
        }
    ),
    st.fixed_dictionaries({"event_type": st.just("STOP"), "connection_id": valid_ids}),
)
mixed_objects = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries(
        {},
        optional={
            "event_type": event_types,
            "connection_id": connection_ids,
            "ws_url": ws_urls | json_values,
        },
    ),
    st.dictionaries(st.text(max_size=8), json_values, max_size=2) | st.just({}),
)


@st.composite
def near_valid_objects(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event with one thing wrong (or not): where a lax check would slip through."""
    payload = dict(draw(valid_objects))
    changes = ["event_type", "connection_id", "ws_url", "ws_url", "extra", "drop"]
    change = draw(st.sampled_from(changes))
    if change == "drop":
        payload.pop(draw(st.sampled_from(sorted(payload))))
    elif change == "extra":
        payload[draw(st.text(max_size=8))] = draw(json_values)
    else:
        payload[change] = draw(
            {
                "event_type": event_types,
                "connection_id": connection_ids,
                "ws_url": st.sampled_from(BAD_URLS) | ws_urls,
            }[change]
        )
    return payload


@st.composite
def requests(draw: st.DrawFn) -> tuple[str | None, bool]:
    """A (body, isBase64Encoded) pair as API Gateway could deliver it."""
    kinds = ["valid", "valid", "near", "near", "mixed", "text", "binary", "json"]
    kind = draw(st.sampled_from(kinds))
    if kind == "binary":
        return base64.b64encode(draw(st.binary(max_size=300))).decode(), True
    if kind == "text":
        return draw(st.none() | st.text(max_size=300)), False
    payload = draw(
        {
            "valid": valid_objects,
            "near": near_valid_objects(),
            "mixed": mixed_objects,
            "json": json_values,
        }[kind]
    )
    text = json.dumps(payload, ensure_ascii=draw(st.booleans()))
    text += " " * draw(st.sampled_from([0, 0, 0, PROPERTY_MAX_BODY_BYTES]))
    if draw(st.booleans()):
        return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode(), True
    return text, False


def test_arbitrary_bodies_leave_only_well_formed_rows_and_notifications(
    router: Router, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("MAX_BODY_BYTES", str(PROPERTY_MAX_BODY_BYTES))
    expected: dict[str, tuple[str, str]] = {}  # id -> (desired_state, ws_url), as we predict
    notifications = 0
    counts = {"valid": 0, "invalid": 0}

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request=requests())
    def throw(request: tuple[str | None, bool]) -> None:
        nonlocal notifications
        body, is_base64 = request
        try:
            parsed = parse_event(decode_body(body, is_base64, PROPERTY_MAX_BODY_BYTES), POLICY)
        except (BadRequest, BodyRefused) as bad:
            counts["invalid"] += 1
            before = router.items()
            status, payload = router.post(body, raw=True, is_base64=is_base64)
            assert (status, payload["field"]) == (400, bad.field)
            assert router.items() == before
            return
        counts["valid"] += 1
        status, payload = router.post(body, raw=True, is_base64=is_base64)
        current = expected.get(parsed.connection_id)
        if isinstance(parsed, StartEvent):
            if current is None:
                want = (201, "created")
            elif current[0] == "STOPPED":
                want = (200, "restarted")
            elif current[1] == parsed.ws_url:
                want = (200, "unchanged")
            else:
                want = (409, "conflict")
            if want[1] in ("created", "restarted"):
                expected[parsed.connection_id] = ("STARTED", parsed.ws_url)
                notifications += 1
        else:
            if current is None:
                want = (404, "not_found")
            elif current[0] == "STARTED":
                want = (200, "stopped")
                expected[parsed.connection_id] = ("STOPPED", current[1])
            else:
                want = (200, "unchanged")
        assert (status, payload["outcome"]) == want
        if status < 300:  # checked here too, not only through parse_event and the model
            check_id("connection_id", payload["connection_id"])
            POLICY.check(payload["state"]["ws_url"])

    throw()

    assert counts["valid"] > 10 and counts["invalid"] > 10, counts
    # Every 2xx came from a body parse_event accepts: the valid ones were the only ones that
    # could get anything but a 400, and each invalid one was checked to get exactly 400.
    assert router.statuses.count(400) == counts["invalid"]
    rows = {}
    for item in router.items():
        connection_id = model.connection_id_of(item["pk"])
        check_id("connection_id", connection_id)
        assert item["desired_state"] in ("STARTED", "STOPPED")
        POLICY.check(item["ws_url"])
        assert (item["desired_state"], item["ws_url"]) == expected[connection_id]
        rows[item["pk"]] = item
    assert len(rows) == len(expected)
    bodies = router.drain()
    assert len(bodies) == notifications
    for body in bodies:
        assert model.parse_notification(body) in rows


# --- The local HTTP adapter -----------------------------------------------------------------


def test_start_through_the_local_http_adapter(router: Router):
    server = make_server()
    thread = serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        request = urllib.request.Request(
            f"{base}/events",
            data=json.dumps(START_BODY).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 201
            assert json.loads(reply.read())["outcome"] == "created"

        with urllib.request.urlopen(f"{base}/connections/c1", timeout=10) as reply:
            assert json.loads(reply.read())["state"]["desired_state"] == "STARTED"

        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(
                urllib.request.Request(f"{base}/events", data=b"\xff", method="POST"), timeout=10
            )
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["field"] == "body"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    assert router.row("c1")["desired_state"] == "STARTED"
    assert router.drain() == [model.notification_body(model.connection_pk("c1"))]

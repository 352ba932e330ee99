"""Who may read a stream, validated at both edges: a START's readers (the event router) and the
reader tags the authorizer passes on from a token's claims.

The router runs against moto's server like its own tests (test_event_router.py); the authorizer
is called with REQUEST events as API Gateway sends them.
"""

from __future__ import annotations

import json

import pytest

from streamfleet import model, readers
from streamfleet.env import ConfigError
from streamfleet.event_router import BadRequest, StartEvent, parse_event
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from tests.router_support import POLICY, URL, Router
from tests.wsapi_support import AUDIENCE, ISSUER, KEY, user_token


def start_body(**extra: object) -> str:
    return json.dumps({"event_type": "START", "connection_id": "m1", "ws_url": URL, **extra})


# --- START's readers ----------------------------------------------------------------------------


def test_a_start_may_name_readers_and_each_entry_is_checked() -> None:
    assert parse_event(start_body(), POLICY) == StartEvent("m1", URL, None)
    parsed = parse_event(start_body(readers=["user:alice", "groups:ops", "user:alice"]), POLICY)
    assert parsed.readers == ("user:alice", "groups:ops")  # duplicates dropped, order kept
    assert parse_event(start_body(readers=[]), POLICY).readers == ()
    assert parse_event(start_body(readers=["user:auth0|5f7c"]), POLICY).readers == (
        "user:auth0|5f7c",
    )
    bad = {
        "user:alice": "readers",  # not a list
        ("x",): "readers[0]",  # a list of one string without a kind
        ("user:alice", "user:"): "readers[1]",
        (":alice",): "readers[0]",
        ("user:a b",): "readers[0]",
        ("user:\u200balice",): "readers[0]",  # invisible format characters
        ("user:" + "a" * 400,): "readers[0]",
        (7,): "readers[0]",
        tuple(f"user:u{i}" for i in range(model.MAX_READERS + 1)): "readers",
    }
    for value, field in bad.items():
        body = start_body(readers=list(value) if isinstance(value, tuple) else value)
        with pytest.raises(BadRequest) as raised:
            parse_event(body, POLICY)
        assert raised.value.field == field, value
    stop = json.dumps({"event_type": "STOP", "connection_id": "m1", "readers": ["user:a"]})
    with pytest.raises(BadRequest, match="readers: unknown field for STOP"):
        parse_event(stop, POLICY)


def test_readers_are_stored_replaced_and_cleared_by_start_and_shown_by_get(router: Router) -> None:
    status, body = router.post(
        {"event_type": "START", "connection_id": "m1", "ws_url": URL, "readers": ["user:b", "g:x"]}
    )
    assert status == 201 and body["state"]["readers"] == ["g:x", "user:b"]
    assert router.row("m1")[model.READERS] == {"user:b", "g:x"}
    assert len(router.drain()) == 1  # notified once, as any START
    # A START without readers leaves them; with readers replaces them; [] clears them.
    assert router.start("m1")[1]["state"]["readers"] == ["g:x", "user:b"]
    status, body = router.post(
        {"event_type": "START", "connection_id": "m1", "ws_url": URL, "readers": ["user:c"]}
    )
    assert status == 200 and body["outcome"] == "unchanged"
    assert router.get("m1")[1]["state"]["readers"] == ["user:c"]
    router.post({"event_type": "START", "connection_id": "m1", "ws_url": URL, "readers": []})
    assert model.READERS not in router.row("m1") and "readers" not in router.get("m1")[1]["state"]
    # A conflicting START (another URL) changes nothing, readers included.
    router.post({"event_type": "START", "connection_id": "m1", "ws_url": URL, "readers": ["u:d"]})
    conflict = {"event_type": "START", "connection_id": "m1", "readers": ["user:e"]}
    status, _ = router.post({**conflict, "ws_url": "ws://127.0.0.1:8765/other"})
    assert status == 409 and router.row("m1")[model.READERS] == {"u:d"}
    # The lease fields are untouched by all of it.
    row = router.row("m1")
    assert row[model.DESIRED_STATE] == "STARTED" and row[model.LEASE_VERSION] == 0


def test_a_bad_readers_list_writes_nothing(router: Router) -> None:
    status, body = router.post(
        {"event_type": "START", "connection_id": "m1", "ws_url": URL, "readers": ["nobody"]}
    )
    assert status == 400 and body["field"] == "readers[0]"
    assert router.items() == [] and router.drain() == []


# --- The authorizer's reader tags ---------------------------------------------------------------


def authorizer(*claims: str) -> Authorizer:
    return Authorizer(
        AuthorizerConfig(
            issuer=ISSUER,
            audience=AUDIENCE,
            keys=json.dumps(jwt.jwks_document([KEY])),
            reader_claims=claims,
        )
    )


def connect_event(token: str) -> dict:
    return {
        "type": "REQUEST",
        "methodArn": "arn:aws:execute-api:us-east-1:123456789012:api/v1/$connect",
        "headers": {"Sec-WebSocket-Protocol": f"streamfleet.v1, bearer.{token}"},
        "queryStringParameters": None,
        "requestContext": {"connectionId": "c1", "apiId": "api"},
    }


def test_the_authorizer_passes_on_the_configured_claims_as_reader_tags() -> None:
    token = user_token(
        "alice",
        groups=["ops", "dev", "bad value", 7],
        tenant="acme",
        secret="x",
        **{"cognito:groups": ["admins"]},
    )
    context = authorizer("groups", "tenant", "cognito:groups", "absent")(connect_event(token))[
        "context"
    ]
    assert json.loads(context[model.WS_CONTEXT_READER_TAGS]) == [
        "groups:ops",
        "groups:dev",
        "tenant:acme",
        "cognito:groups:admins",
    ]
    # Without JWT_READER_CLAIMS the context carries no tags.
    plain = authorizer()(connect_event(token))["context"]
    assert set(plain) == {"sub", "tokenTransport", "principalKind", "tokenExpiresAt"}


def test_reader_tags_are_bounded_so_the_answer_stays_under_api_gateways_limit() -> None:
    token = user_token("alice", groups=[f"group-{i:03d}-" + "x" * 150 for i in range(30)])
    answer = authorizer("groups")(connect_event(token))
    tags = json.loads(answer["context"][model.WS_CONTEXT_READER_TAGS])
    assert 0 < len(tags) < 30 and len(json.dumps(answer)) < 8 * 1024


def test_reader_claims_are_validated_and_user_is_reserved() -> None:
    env = {
        "JWT_ISSUER": ISSUER,
        "JWT_AUDIENCE": AUDIENCE,
        "JWT_KEYS": json.dumps(jwt.jwks_document([KEY])),
    }
    assert AuthorizerConfig.from_env(
        {**env, "JWT_READER_CLAIMS": " groups, tenant "}
    ).reader_claims == (
        "groups",
        "tenant",
    )
    for bad in ("user", "user:x", "gro ups", "a" * 65):
        with pytest.raises(ConfigError, match="JWT_READER_CLAIMS"):
            AuthorizerConfig.from_env({**env, "JWT_READER_CLAIMS": bad})


def test_a_context_cannot_smuggle_a_user_tag() -> None:
    # The handlers take the user tag from the verified sub only.
    assert readers.decode_tags('["user:admin","groups:ops"]') == ["groups:ops"]
    assert readers.decode_tags("not json") == readers.decode_tags('{"a":1}') == []
    assert readers.may_read({"groups:ops"}, ["user:bob", "groups:ops"])
    assert not readers.may_read(set(), ["user:bob"]) and not readers.may_read(None, ["user:bob"])

"""The integration test's probe (integ/streamfleet_integ/probe.py) against local stand-ins.

On AWS the probe is the only code of the integration test that is not the app's own, and a
run costs most of an hour; here it meets what it meets there, on loopback: the real
authorizer and subscribe handler behind the local gateway (dynalite tables), its user key in a
Secrets Manager secret (moto's server), and for START an HTTP server that answers as the REST
API would and keeps what it received.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from cryptography.hazmat.primitives import serialization

from streamfleet import model
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from streamfleet.wsapi.delivery import StoredMessage, pack_frames
from streamfleet_integ import probe
from tests import wsapi_live_support
from tests.wsapi_live_support import LiveTablesSet, live_gateway
from tests.wsapi_support import REGION

live_tables = wsapi_live_support.live_tables  # the fixture

ISSUER = "https://idp.integ.test/"
AUDIENCE = "streamfleet"
SUBJECT = "streamfleet-integ"
STREAM = "integ-streamfleet"
UPSTREAM = "wss://feed.integ.test/stream"
USER_KEY = jwt.generate_signing_key(jwt.RS256, kid="integ-user-1")  # a PEM, as the README says


@pytest.fixture
def probe_env(servers, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The probe's environment as the integ stack sets it; its key in moto's Secrets Manager."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", servers["moto"].endpoint)
    secret_name = f"streamfleet-integ/user-key-{id(monkeypatch)}"
    pem = USER_KEY.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    secrets = boto3.client("secretsmanager", region_name=REGION)
    secrets.create_secret(Name=secret_name, SecretString=pem)
    for name, value in {
        "CONNECTION_ID": STREAM,
        "UPSTREAM_URL": UPSTREAM,
        "SUBJECT": SUBJECT,
        "USER_KEY_SECRET_NAME": secret_name,
        "USER_KEY_ID": "integ-user-1",
        "JWT_ISSUER": ISSUER,
        "JWT_AUDIENCE": AUDIENCE,
        "LISTEN_SECONDS": "10",
    }.items():
        monkeypatch.setenv(name, value)
    yield
    secrets.delete_secret(SecretId=secret_name, ForceDeleteWithoutRecovery=True)


def authorizer() -> Authorizer:
    """The Region's authorizer, trusting the JWKS that publishes the probe's key."""
    return Authorizer(
        AuthorizerConfig(
            issuer=ISSUER, audience=AUDIENCE, keys=json.dumps(jwt.jwks_document([USER_KEY]))
        )
    )


# --- subscribe ---


async def test_the_probe_sees_the_replay_then_a_live_frame_and_the_region(
    live_tables: LiveTablesSet, probe_env: None
) -> None:
    tables = live_tables
    tables.start_stream(STREAM, readers=(f"user:{SUBJECT}",))
    tables.store(STREAM, range(1, 4))
    async with live_gateway(tables, auth=authorizer()) as gateway:
        seen = asyncio.create_task(asyncio.to_thread(probe.subscribe, gateway.url))
        # What the fan-out does once the fleet stores the next message: post it, live.
        while not tables.subscribers(STREAM):
            assert not seen.done(), seen.result()
            await asyncio.sleep(0.05)
        (connection_id,) = tables.subscribers(STREAM)
        (frame,) = pack_frames(STREAM, [StoredMessage(4, "4")], region=REGION, source="live")
        management = boto3.client(
            "apigatewaymanagementapi", endpoint_url=gateway.management_endpoint, region_name=REGION
        )
        await asyncio.to_thread(
            management.post_to_connection, ConnectionId=connection_id, Data=frame
        )
        answer = await seen
    assert answer == {"subscribed": True, "replayed": True, "live": True, "region": REGION}


async def test_without_a_live_frame_the_probe_answers_when_its_time_is_up(
    live_tables: LiveTablesSet, probe_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LISTEN_SECONDS", "1")
    tables = live_tables
    tables.start_stream(STREAM, readers=(f"user:{SUBJECT}",))
    tables.store(STREAM, range(1, 4))
    async with live_gateway(tables, auth=authorizer()) as gateway:
        answer = await asyncio.to_thread(probe.subscribe, gateway.url)
    # The assertion waits for live: true, so this answer is retried, not taken.
    assert answer == {"subscribed": True, "replayed": True, "live": False, "region": REGION}


async def test_a_probe_that_is_not_a_reader_is_refused_and_says_so_at_once(
    live_tables: LiveTablesSet, probe_env: None
) -> None:
    tables = live_tables
    tables.start_stream(STREAM, readers=("user:someone-else",))
    tables.store(STREAM, range(1, 4))
    async with live_gateway(tables, auth=authorizer()) as gateway:
        answer = await asyncio.to_thread(probe.subscribe, gateway.url)
    assert answer["subscribed"] is False and answer["live"] is False
    assert answer["error"]["type"] == model.WS_REPLY_ERROR


# --- START ---


class RestApi:
    """An HTTP server answering ``POST /prod/events`` with ``status``, keeping each request."""

    def __init__(self, status: int) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, dict(self.headers), json.loads(body)))
                answer = json.dumps({"connection_id": STREAM}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/prod/"

    def __enter__(self) -> RestApi:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def start_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDINTEGTEST",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "session",
        "AWS_DEFAULT_REGION": REGION,
        "CONNECTION_ID": STREAM,
        "UPSTREAM_URL": UPSTREAM,
        "SUBJECT": SUBJECT,
    }.items():
        monkeypatch.setenv(name, value)
    yield


@pytest.mark.parametrize(("status", "accepted"), [(201, True), (200, True), (403, False)])
def test_the_probe_starts_the_stream_signed_naming_itself_as_reader(
    start_env: None, monkeypatch: pytest.MonkeyPatch, status: int, accepted: bool
) -> None:
    with RestApi(status) as api:
        monkeypatch.setenv("API_URL", api.url)
        answer = probe.start()
    assert answer["accepted"] is accepted and answer["statusCode"] == status
    assert json.loads(answer["body"]) == {"connection_id": STREAM}
    ((path, headers, body),) = api.received
    assert path == "/prod/events"
    assert body == {
        "event_type": "START",
        "connection_id": STREAM,
        model.WS_URL: UPSTREAM,
        model.READERS: [f"user:{SUBJECT}"],
    }
    authorization = headers["Authorization"]
    assert authorization.startswith(
        f"AWS4-HMAC-SHA256 Credential=AKIDINTEGTEST/{headers['X-Amz-Date'][:8]}/{REGION}"
        "/execute-api/aws4_request"
    )
    assert "host" in authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert headers["X-Amz-Security-Token"] == "session"  # a Lambda role's credentials have one

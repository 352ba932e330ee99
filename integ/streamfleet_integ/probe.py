"""The integration test's probe: a Lambda in the primary Region that does what a producer and
a client do, and reports what it saw as JSON the assertions match.

* ``{"action": "start"}``: ``POST /events`` START of the run's stream against the test upstream,
  signed with SigV4 as every producer must (the REST API takes IAM authorization only, and
  integ-tests' HTTP call cannot sign), naming the probe's ``user:<sub>`` as the stream's reader.
  Answers ``{"accepted": <201 or 200>, "statusCode": ..., "body": ...}``.
* ``{"action": "subscribe", "url": "wss://..."}``: connects to that WebSocket URL with a user
  token it mints from the key in Secrets Manager, subscribes to the stream and reads frames
  until it has had the reply, a replayed frame and one the fan-out sent (``source: live``),
  or the time is up. Answers
  ``{"subscribed": ..., "replayed": ..., "live": ..., "region": <Region of the last frame>}``.

Configuration from the environment (the integ stack sets it): ``API_URL``, ``CONNECTION_ID``,
``UPSTREAM_URL``, ``SUBJECT``, ``USER_KEY_SECRET_NAME``, ``USER_KEY_ID`` (optional),
``JWT_ISSUER``, ``JWT_AUDIENCE``, ``LISTEN_SECONDS``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from websockets.sync.client import connect

from streamfleet import model
from streamfleet.wsapi import jwt
from streamfleet.wsapi.handshake import Endpoint

TOKEN_LIFETIME_SECONDS = 300
HTTP_TIMEOUT_SECONDS = 20
DEFAULT_LISTEN_SECONDS = 60
WANTED = ("subscribed", "replayed", "live")


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    action = event.get("action")
    if action == "start":
        return start()
    if action == "subscribe":
        return subscribe(str(event["url"]))
    raise ValueError(f"action: expected start or subscribe, got {action!r}")


def start() -> dict[str, Any]:
    body = json.dumps(
        {
            "event_type": "START",
            "connection_id": os.environ["CONNECTION_ID"],
            model.WS_URL: os.environ["UPSTREAM_URL"],
            model.READERS: [f"user:{os.environ['SUBJECT']}"],
        }
    )
    url = os.environ["API_URL"].rstrip("/") + "/events"
    session = boto3.Session()
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(session.get_credentials(), "execute-api", session.region_name).add_auth(request)
    prepared = urllib.request.Request(
        url, data=body.encode(), headers=dict(request.headers.items()), method="POST"
    )
    try:
        with urllib.request.urlopen(prepared, timeout=HTTP_TIMEOUT_SECONDS) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        status, text = refused.code, refused.read().decode()
    return {"accepted": status in (200, 201), "statusCode": status, "body": text}


def user_token() -> str:
    secret = boto3.client("secretsmanager").get_secret_value(
        SecretId=os.environ["USER_KEY_SECRET_NAME"]
    )
    key = jwt.signing_key_from_text(secret["SecretString"], kid=os.environ.get("USER_KEY_ID"))
    now = int(time.time())
    claims = {
        "sub": os.environ["SUBJECT"],
        "iss": os.environ["JWT_ISSUER"],
        "aud": os.environ["JWT_AUDIENCE"],
        "iat": now,
        "exp": now + TOKEN_LIFETIME_SECONDS,
    }
    return jwt.sign(claims, key)


def subscribe(url: str) -> dict[str, Any]:
    dial, protocols = Endpoint(url, user_token()).handshake()
    deadline = time.monotonic() + float(os.environ.get("LISTEN_SECONDS", DEFAULT_LISTEN_SECONDS))
    seen: dict[str, Any] = {"subscribed": False, "replayed": False, "live": False, "region": None}
    with connect(dial, subprotocols=protocols, open_timeout=HTTP_TIMEOUT_SECONDS) as socket:
        socket.send(
            json.dumps(
                {
                    "action": model.WS_ROUTE_SUBSCRIBE,
                    "stream": os.environ["CONNECTION_ID"],
                    "after": None,
                }
            )
        )
        # Until all three: a live frame may come before the reply, the subscriber being
        # registered before the replay is read (the handler's order, so that none is missed).
        while not all(seen[k] for k in WANTED) and (left := deadline - time.monotonic()) > 0:
            try:
                frame = json.loads(socket.recv(timeout=left))
            except TimeoutError:
                break
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind == model.WS_REPLY_ERROR:
                # A refusal (not a reader, no such stream) is the answer: waiting cannot fix it.
                return {**seen, "error": frame}
            seen["region"] = frame.get("region", seen["region"])
            if kind == model.WS_REPLY_SUBSCRIBED:
                seen["subscribed"] = True
            elif kind == model.WS_REPLY_MESSAGES:
                seen["replayed" if frame.get("source") == "replay" else "live"] = True
    return seen

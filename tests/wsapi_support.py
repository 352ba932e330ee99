"""What the WebSocket API tests share: one issuer and key, fresh tables, a running gateway.

``conftest.py`` registers the fixtures; test modules import the constants.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from streamfleet.wsapi.handlers.config import make_dynamodb_client
from streamfleet_auction.extension import auction_extension
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, LocalGateway, wsapi_gateway
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables

REGION = "us-east-1"
ISSUER = "https://issuer.test"
AUDIENCE = "wsapi-test"
KEY = jwt.generate_signing_key(jwt.HS256, kid="test")  # HS256: fast, and allowed locally
CANARY_KEY = jwt.generate_signing_key(jwt.HS256, kid="canary")  # the canary's own key


def authorizer() -> Authorizer:
    """Users' tokens signed with KEY; the canary's with CANARY_KEY (and its own issuer)."""
    return Authorizer(
        AuthorizerConfig(
            issuer=ISSUER,
            audience=AUDIENCE,
            keys=json.dumps(jwt.jwks_document([KEY])),
            canary_keys=json.dumps(jwt.jwks_document([CANARY_KEY])),
        )
    )


def user_token(sub: str, lifetime: int = 300, **claims: object) -> str:
    """A valid user token for ``sub`` (``claims`` add or override members)."""
    now = int(time.time())
    base = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + lifetime}
    return jwt.sign({**base, **claims}, KEY)


@pytest.fixture
def tables(moto) -> Iterator[tuple[str, str]]:
    """A fresh state table and connections table on the moto server."""
    suffix = uuid.uuid4().hex[:10]
    state, connections = f"test-wsstate-{suffix}", f"test-wsconn-{suffix}"
    client = make_dynamodb_client(REGION)
    create_wsapi_tables(client, state_table=state, connections_table=connections)
    yield state, connections
    delete_wsapi_tables(client, state_table=state, connections_table=connections)


@pytest.fixture
async def gateway(tables: tuple[str, str]) -> AsyncIterator[LocalGateway]:
    """The real handlers and authorizer behind the local API Gateway stand-in, with the demo
    auction installed, as the app deploys them by default."""
    state, connections = tables
    async with wsapi_gateway(
        GatewaySettings(region=REGION),
        authorizer=authorizer(),
        state_table=state,
        connections_table=connections,
        extensions=(auction_extension(),),
    ) as running:
        yield running

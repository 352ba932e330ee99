"""What the live-delivery tests share: the fleet's tables and the WebSocket API's, on one server,
a gateway whose handlers serve subscribe, and helpers that play the fleet (rows, messages).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from streamfleet import model
from streamfleet.lease.dynamo import to_attr, to_item
from streamfleet.wsapi.authorizer import Authorizer
from streamfleet.wsapi.handlers.config import LiveTables
from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, LocalGateway, wsapi_gateway
from streamfleet_dev.tables import create_tables
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables
from tests.wsapi_support import REGION, authorizer


@dataclass
class LiveTablesSet:
    """Every table one Region's live delivery touches, with a synchronous client."""

    dynamodb: object
    state: str
    connections: str
    subscriptions: str
    leases: str
    messages: str
    stream_enabled: bool = False  # the messages table's change stream, where the server has one

    def live(self, **settings: int) -> LiveTables:
        """Live delivery over these tables (``settings``: LiveTables' bounds by name)."""
        return LiveTables(self.leases, self.messages, self.subscriptions, **settings)

    def start_stream(
        self, stream: str, *, readers: tuple[str, ...] = (), origin: int | None = 0
    ) -> None:
        """A connection row as START (readers) and a first owner (origin) leave it."""
        item = {model.PK: model.connection_pk(stream), model.DESIRED_STATE: "STARTED"}
        if readers:
            item[model.READERS] = set(readers)
        if origin is not None:
            item[model.ORIGIN_SEQ] = origin
        self.dynamodb.put_item(TableName=self.leases, Item=to_item(item))

    def store(
        self,
        stream: str,
        seqs,
        *,
        data=None,
        received_at_ms: int | None = None,
        prev: dict[int, tuple[int, int | None]] | None = None,
    ) -> None:
        """Store messages as the workers' sink does: ``(CONN#<id>, seq)``; ``prev`` gives some
        seqs the ``(prev_seq, prev_expires_at)`` their writer recorded."""
        requests = []
        for seq in seqs:
            item = {
                model.PK: to_attr(model.connection_pk(stream)),
                model.SEQ: to_attr(seq),
                model.MESSAGE_DATA: to_attr(data(seq) if data else f"message {seq}"),
                model.MESSAGE_RECEIVED_AT_MS: to_attr(received_at_ms or 1_700_000_000_000 + seq),
            }
            prev_seq, prev_expires_at = (prev or {}).get(seq, (None, None))
            if prev_seq is not None:
                item[model.MESSAGE_PREV_SEQ] = to_attr(prev_seq)
            if prev_expires_at is not None:
                item[model.MESSAGE_PREV_EXPIRES_AT] = to_attr(prev_expires_at)
            requests.append({"PutRequest": {"Item": item}})
        for start in range(0, len(requests), 25):
            pending = requests[start : start + 25]
            while pending:
                response = self.dynamodb.batch_write_item(RequestItems={self.messages: pending})
                pending = response.get("UnprocessedItems", {}).get(self.messages, [])

    def store_restarted(self, stream: str, *, old: int, new: int, data=None) -> None:
        """Seqs 1..``old`` of epoch 0, then 1..``new`` of epoch 1 (the upstream numbered from 1
        again), chained as the worker stores them: epoch 1's first follows epoch 0's last."""
        first = model.log_position(1, 1)
        self.store(
            stream,
            [*range(1, old + 1), *range(first, first + new)],
            data=data,
            prev={1: (0, None), first: (old, None)},
        )

    def subscribers(self, stream: str) -> list[str]:
        response = self.dynamodb.query(
            TableName=self.subscriptions,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": model.PK},
            ExpressionAttributeValues={":pk": to_attr(model.stream_subscribers_pk(stream))},
            ConsistentRead=True,
        )
        return [item[model.SUB_CONNECTION]["S"] for item in response["Items"]]


@contextlib.contextmanager
def live_table_set(prefix: str) -> Iterator[LiveTablesSet]:
    """Every table one Region's live delivery touches, fresh, on the current DynamoDB endpoint;
    deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    tables = LiveTablesSet(
        dynamodb,
        *(
            f"{prefix}-{kind}-{suffix}"
            for kind in ("wsstate", "wsconn", "wssubs", "leases", "messages")
        ),
    )
    wsapi = {
        "state_table": tables.state,
        "connections_table": tables.connections,
        "subscriptions_table": tables.subscriptions,
    }
    create_wsapi_tables(dynamodb, **wsapi)
    created = create_tables(dynamodb, lease_table=tables.leases, messages_table=tables.messages)
    tables.stream_enabled = all(not c.not_applied or "TTL" in c.not_applied[0] for c in created)
    try:
        yield tables
    finally:
        delete_wsapi_tables(dynamodb, **wsapi)
        for name in (tables.leases, tables.messages):
            dynamodb.delete_table(TableName=name)


@pytest.fixture
def live_tables(servers, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveTablesSet]:
    """Every table on dynalite (which applies an item's writes one at a time, as DynamoDB)."""
    for name, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    with live_table_set("test") as tables:
        yield tables


def live_gateway(
    tables: LiveTablesSet, *, auth: Authorizer | None = None, **settings: int
) -> LocalGateway:
    """A gateway whose handlers serve subscribe over ``tables`` (not yet started)."""
    return wsapi_gateway(
        GatewaySettings(region=REGION),
        authorizer=auth or authorizer(),
        state_table=tables.state,
        connections_table=tables.connections,
        live=tables.live(**settings),
    )


async def running(gateway: LocalGateway) -> AsyncIterator[LocalGateway]:
    async with gateway as started:
        yield started


@pytest.fixture
def moto_tables(moto) -> Any:
    with live_table_set("fo") as tables:
        # On moto the messages table's stream is on (dynalite has none; only its TTL may not be).
        assert tables.stream_enabled
        yield tables, moto.endpoint

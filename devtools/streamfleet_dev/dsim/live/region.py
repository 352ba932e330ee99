"""One Region of the WebSocket API as a schedule runs it: its tables, its API Gateway stand-in,
the handlers behind it and the fan-out reading its messages replica's change stream."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING

from streamfleet import model
from streamfleet.wsapi import fanout as fanout_module
from streamfleet.wsapi.handlers import WsApiHandlers
from streamfleet.wsapi.handlers.config import HandlerConfig, LiveTables
from streamfleet.wsapi.handlers.replier import ManagementApiReplier
from streamfleet_auction.config import AuctionConfig
from streamfleet_auction.extension import auction_extension
from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel
from streamfleet_dev.dsim.greenlets import TaskPool
from streamfleet_dev.dsim.live.aws import (
    FANOUT_DYNAMODB_SDK,
    FANOUT_MANAGEMENT_SDK,
    HANDLER_SDK,
    Gateway,
    Management,
    SimDynamoDB,
)

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.world import World

PRIMARY = "us-east-1"
SECONDARY = "us-west-2"
TABLES = {
    "streams": (model.LEASE_TABLE, "dsim-streams"),
    "messages": (model.MESSAGES_TABLE, "dsim-messages"),
    "subscriptions": (model.WSAPI_SUBSCRIPTIONS_TABLE, "dsim-subscriptions"),
    "state": (model.WSAPI_STATE_TABLE, "dsim-state"),
    "connections": (model.WSAPI_CONNECTIONS_TABLE, "dsim-connections"),
}


class Region:
    """A Region's stores and the code under test that runs there.

    Every Region has every table under the same name, as global tables and the per-Region
    WebSocket tables are deployed; what the primary's fleet writes reaches another Region only
    through :class:`~streamfleet_dev.dsim.live.replication.Replication`."""

    def __init__(self, world: World, name: str, *, connection_prefix: str):
        self.name = name
        self.store = DynamoDBModel(name)
        self.names = {key: table_name for key, (_, table_name) in TABLES.items()}
        for spec, table_name in TABLES.values():
            self.store.create_table(spec, table_name)
        # The Region's WebSocket API answers handshakes and routes messages (False while it is
        # down: its handlers throttled, or the whole Region cut off).
        self.api_up = True
        # Cut off from the outside: clients and the other Region's replication cannot reach it
        # (its own fleet, tables and functions go on).
        self.isolated = False
        # (stream, group) -> [from, until): when its replica surely excluded the group from the
        # stream's readers (until None: to the end).
        self.excluded: dict[tuple[str, str], list[tuple[int, int | None]]] = {}
        self.fanout_calls: Counter[str] = Counter()  # this invocation's, by connection
        # Each Region's stage has its own Management API endpoint (the primary's as it was
        # before a second Region existed, so its traces stay the same).
        endpoint = "https://sim.example/live" + ("" if name == PRIMARY else f"/{name}")
        self.gateway = Gateway(world, self, connection_prefix)
        # As the app deploys them by default: with the demo auction, whose part of getState
        # reads the user's item (the simulated clients never bid).
        self.handlers = WsApiHandlers(
            HandlerConfig(
                state_table=self.names["state"],
                connections_table=self.names["connections"],
                region=name,
                management_endpoint=endpoint,
                live=LiveTables(
                    streams_table=self.names["streams"],
                    messages_table=self.names["messages"],
                    subscriptions_table=self.names["subscriptions"],
                    newest=world.schedule.newest,
                    replay_max=world.schedule.replay_max,
                ),
            ),
            dynamodb=SimDynamoDB(world, "handler", HANDLER_SDK, self),
            replier=ManagementApiReplier(
                region=name,
                endpoint=endpoint,
                client_factory=lambda _endpoint: Management(world, "handler", HANDLER_SDK, self),
            ),
            clock=world.clock,
            extensions=(auction_extension(AuctionConfig()),),
        )
        seed = world.schedule.seed
        self.fanout = fanout_module.Fanout(
            fanout_module.FanoutConfig(
                subscriptions_table=self.names["subscriptions"],
                management_endpoint=endpoint,
                region=name,
                streams_table=self.names["streams"],
                post_threads=4,
            ),
            dynamodb=SimDynamoDB(world, "fanout", FANOUT_DYNAMODB_SDK, self),
            management=Management(world, "fanout", FANOUT_MANAGEMENT_SDK, self),
            clock=world.clock,
            metrics_out=lambda _line: None,
            pool=TaskPool(world.scheduler, "fanout-post", 4),
            sleep=world.scheduler.sleep,
            # The primary's draws as they were before a second Region existed.
            rng=random.Random(f"fanout-{seed}" if name == PRIMARY else f"fanout-{seed}-{name}"),
        )

    @property
    def primary(self) -> bool:
        return self.name == PRIMARY

    def holds(self, stream: str, position: int) -> bool:
        """Whether this Region's messages replica holds ``position`` of ``stream`` now."""
        item = self.store.call(
            "get_item",
            {
                "TableName": self.names["messages"],
                "Key": {
                    model.PK: {"S": model.connection_pk(stream)},
                    model.SEQ: {"N": str(position)},
                },
                "ConsistentRead": True,
            },
        )
        return "Item" in item

"""The auction as a route extension of the core handler (:mod:`streamfleet.wsapi.handlers.
extensions`): the ``bid`` route and the ``auction`` field of ``getState``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamfleet.wsapi.handlers.extensions import (
    ExtensionContext,
    ExtensionRoute,
    RouteExtension,
    StateRequest,
)
from streamfleet.wsapi.handlers.state_store import StateReplica

from .auctions import Auctions
from .config import AuctionConfig, make_home_client
from .messages import BID_FIELDS, STATE_FIELDS, AuctionState, PlaceBid, parse_bid, parse_state
from .names import ENV_STATE_HOME_REGION, WS_ROUTE_BID


@dataclass(frozen=True)
class _BoundAuctions:
    auctions: Auctions

    def handle(
        self, user_id: str, message: Any, time_left_ms: Callable[[], int] | None
    ) -> dict[str, Any]:
        bid: PlaceBid = message
        return self.auctions.place_bid(user_id, bid.auction, bid.amount, time_left_ms=time_left_ms)

    def add_state(self, user_id: str, request: Any, reply: dict[str, Any]) -> dict[str, Any]:
        state: AuctionState = request
        return self.auctions.add_state(user_id, state.auction, reply)


def auction_extension(
    config: AuctionConfig | None = None, *, home: StateReplica | None = None
) -> RouteExtension:
    """The demo auction, ready to install in :class:`~streamfleet.wsapi.handlers.WsApiHandlers`.

    ``config``: where bids are decided (default: read from the handlers' environment,
    ``STATE_HOME_REGION``); ``home``: the home replica, when it is not this Region's (default:
    the table of the core's state-table name in the home Region).
    """

    def bind(context: ExtensionContext) -> _BoundAuctions:
        settings = config or AuctionConfig.from_env(context.environment)
        local = context.state.local
        home_region = settings.home(local.region)
        if home_region == local.region:
            replica = local
        else:
            replica = home or StateReplica(home_region, local.table, make_home_client(home_region))
        return _BoundAuctions(Auctions(context.state, replica))

    return RouteExtension(
        name="auction",
        routes={WS_ROUTE_BID: ExtensionRoute(BID_FIELDS, parse_bid)},
        bind=bind,
        state_request=StateRequest(STATE_FIELDS, parse_state),
        environment=(ENV_STATE_HOME_REGION,),
    )

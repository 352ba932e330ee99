"""The demo auction's vocabulary: its state-table keys and item fields, its route, its reply,
and the environment variable it reads. Shared by its runtime, its CDK spec
(``streamfleet_auction_cdk``) and the local tools, as :mod:`streamfleet.model` is by the core's.

The auction keeps three kinds of items in the core's state table (a global table, keyed by the
verified user, never by a connection id): ``USER#<sub>`` (the user's last bid and counters),
``AUCTION#<id>`` (the live highest bid) and ``BID#<auction>#<amount>`` (one immutable record per
accepted bid; accepted amounts strictly increase, so the amount is a unique id). Every write
goes through the core's :class:`~streamfleet.wsapi.handlers.state_store.StateStore`, so each
item carries the core's ``updated_at_ms`` and ``writer_region``.
"""

from __future__ import annotations

# The Region whose state-table replica decides every bid (default: the handler's own Region).
ENV_STATE_HOME_REGION = "STATE_HOME_REGION"

# The Lambda entry point of the handler with the auction installed.
HANDLER_ENTRY = "streamfleet_auction.handler.handler"

WS_ROUTE_BID = "bid"
WS_REPLY_BID = "bid"

USER_PREFIX = "USER#"
AUCTION_PREFIX = "AUCTION#"
BID_PREFIX = "BID#"
# Where the home is another Region, the handler writes these items there, and only these.
HOME_KEY_PREFIXES = (AUCTION_PREFIX, BID_PREFIX)
BID_AMOUNT_DIGITS = 20  # zero-padded, so the keys of one auction sort by amount


def user_pk(user_id: str) -> str:
    """The state-table key of a user's bids: ``USER#<sub>``."""
    return f"{USER_PREFIX}{user_id}"


def auction_pk(auction_id: str) -> str:
    """The state-table key of an auction's live highest bid: ``AUCTION#<id>``."""
    return f"{AUCTION_PREFIX}{auction_id}"


def bid_pk(auction_id: str, amount: int) -> str:
    """The state-table key of one accepted bid: ``BID#<auction>#<zero-padded amount>``."""
    return f"{BID_PREFIX}{auction_id}#{amount:0{BID_AMOUNT_DIGITS}d}"


# Item fields.
AUCTION_ID = "auction"
HIGHEST_AMOUNT = "highest"
HIGHEST_BIDDER = "highest_bidder"
BID_COUNT = "bids"
BID_AMOUNT = "amount"
BID_BIDDER = "bidder"
BID_AT_MS = "at_ms"
LAST_BID_AUCTION = "last_bid_auction"
LAST_BID_AMOUNT = "last_bid_amount"
LAST_BID_AT_MS = "last_bid_at_ms"
BIDS_ACCEPTED = "bids_accepted"
BIDS_REFUSED = "bids_refused"

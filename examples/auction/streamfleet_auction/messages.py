"""What a bidder sends: ``bid`` (``{"action": "bid", "auction": "a1", "amount": 123}``) and the
``auction`` field of ``getState``, parsed with the core's field checks, each refusal naming its
field (:class:`~streamfleet.wsapi.handlers.messages.BadMessage`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamfleet.wsapi.handlers.messages import BadMessage, identifier, whole_number

MAX_AUCTION_ID_CHARS = 128
MAX_BID_AMOUNT = 10**15  # below 2**53 (JavaScript clients) and BID_AMOUNT_DIGITS digits

BID_FIELDS = ("auction", "amount")
STATE_FIELDS = ("auction",)


@dataclass(frozen=True)
class PlaceBid:
    auction: str
    amount: int


@dataclass(frozen=True)
class AuctionState:
    """What ``getState`` asks of the auction: one auction (``None``: the user's last)."""

    auction: str | None = None


def parse_bid(payload: Mapping[str, Any]) -> PlaceBid:
    """A ``bid``: both fields required, the amount a whole number from 1 to
    :data:`MAX_BID_AMOUNT`."""
    for field in BID_FIELDS:
        if field not in payload:
            raise BadMessage(field, "required")
    return PlaceBid(
        identifier(payload, "auction", MAX_AUCTION_ID_CHARS),
        whole_number(payload, "amount", "a whole number", minimum=1, maximum=MAX_BID_AMOUNT),
    )


def parse_state(payload: Mapping[str, Any]) -> AuctionState:
    """The ``auction`` of a ``getState``, if it names one."""
    if "auction" not in payload:
        return AuctionState()
    return AuctionState(identifier(payload, "auction", MAX_AUCTION_ID_CHARS))

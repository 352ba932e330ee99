"""The demo auction's logic: its part of ``getState`` (the user's bids, and one auction as this
Region's replica holds it) and ``bid``, decided by a conditional write in the auctions' home
Region whichever Region serves the bidder."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from streamfleet import model
from streamfleet.lease.dynamo import error_code, is_condition_failure, names, to_attr
from streamfleet.wsapi.handlers.messages import Refused
from streamfleet.wsapi.handlers.state_store import StateReplica, StateStore, StateWriteConflict

from . import names as demo
from .config import HOME_CALL_MAX_MS

# The handlers' logger: their log lines keep one name whichever module writes them.
logger = logging.getLogger("streamfleet.wsapi.handlers")


class Auctions:
    """Every auction's bids, and the user's record of their own."""

    def __init__(self, state: StateStore, home: StateReplica):
        """``home``: the auctions' home replica (``state.local`` when it is this Region's)."""
        self.state = state
        self.local = state.local
        self.home = home

    def add_state(self, user_id: str, auction: str | None, core: dict[str, Any]) -> dict[str, Any]:
        """The core's ``getState`` reply with the user's bids (``state``, after ``user``) and
        one auction's (``auction``, last: the requested one, else the user's last)."""
        user = self.state.read(demo.user_pk(user_id))
        state: dict[str, Any] = {
            "lastBid": None,
            "bidsAccepted": 0,
            "bidsRefused": 0,
            "updatedAtMs": None,
        }
        if user:
            if demo.LAST_BID_AUCTION in user:
                state["lastBid"] = {
                    "auction": user[demo.LAST_BID_AUCTION],
                    "amount": user.get(demo.LAST_BID_AMOUNT),
                    "atMs": user.get(demo.LAST_BID_AT_MS),
                }
            state["bidsAccepted"] = user.get(demo.BIDS_ACCEPTED, 0)
            state["bidsRefused"] = user.get(demo.BIDS_REFUSED, 0)
            state["updatedAtMs"] = user.get(model.UPDATED_AT_MS)
        # Placed after the core's type and user, before what else the core put there.
        reply = {**{key: core[key] for key in ("type", "user") if key in core}, "state": state}
        reply.update((key, value) for key, value in core.items() if key not in reply)
        auction = auction or (state["lastBid"] or {}).get("auction")
        if auction:
            reply["auction"] = self._auction_view(auction, user_id)
        return reply

    def _auction_view(self, auction: str, user_id: str) -> dict[str, Any]:
        """The auction as this Region's replica holds it. Read here, not in the home Region, so
        a state read never waits on another Region; ``stale`` tells the client that this
        replica may lag the home by the replication lag (a bid's own reply never does)."""
        item = self.state.read(demo.auction_pk(auction)) or {}
        return {
            "auction": auction,
            "highest": item.get(demo.HIGHEST_AMOUNT, 0),
            "highestIsYou": item.get(demo.HIGHEST_BIDDER) == user_id,
            "bids": item.get(demo.BID_COUNT, 0),
            "homeRegion": self.home.region,
            "stale": self.home is not self.local,
        }

    def place_bid(
        self,
        user_id: str,
        auction: str,
        amount: int,
        *,
        time_left_ms: Callable[[], int] | None = None,
    ) -> dict[str, Any]:
        """Accept ``amount`` only if strictly above the auction's highest, atomically, in the
        auction's home Region (:meth:`~.config.AuctionConfig.home`) whichever Region serves the
        bidder: an acknowledged bid is then never replaced by a lower one from another Region.

        When the home cannot be reached (or there is not time left to reach it) the bid is
        refused as retryable. A retry of a bid whose answer was lost (botocore's own retry, or
        the client's) is recognised while the bid is still the highest: it is acknowledged, its
        record written if it was not, and the user's counters moved once."""
        try:
            self._home_call_fits(time_left_ms)
            outcome = self.state.write(
                demo.auction_pk(auction),
                sets={
                    demo.AUCTION_ID: auction,
                    demo.HIGHEST_AMOUNT: amount,
                    demo.HIGHEST_BIDDER: user_id,
                },
                adds={demo.BID_COUNT: 1},
                condition=f"attribute_not_exists(#{demo.HIGHEST_AMOUNT}) OR "
                f"#{demo.HIGHEST_AMOUNT} < :amount",
                condition_names=(demo.HIGHEST_AMOUNT,),
                condition_values={":amount": amount},
                still_applies=lambda old: old.get(demo.HIGHEST_AMOUNT, 0) < amount,
                replica=self.home,
            )
            old = outcome.current or {}
            # This bidder's own bid already decided: acknowledge it again rather than refuse it.
            ours_already = not outcome.written and (
                old.get(demo.HIGHEST_AMOUNT) == amount and old.get(demo.HIGHEST_BIDDER) == user_id
            )
            accepted = outcome.written or ours_already
            if accepted:
                self._home_call_fits(time_left_ms)
                self._record_bid(auction, amount, user_id, outcome.timestamp_ms)
        except (BotoCoreError, ClientError, StateWriteConflict, _HomeOutOfTime) as exc:
            if self.home is self.local or not _home_unreachable(exc):
                raise
            raise Refused(
                "home_unavailable",
                "auction",
                f"the auction's home Region {self.home.region} did not answer "
                f"({_describe(exc)}); the bid may not have been accepted: retry it "
                "(a retried bid that is still the highest is acknowledged)",
                retryable=True,
            ) from exc
        if accepted:
            highest, is_you = amount, True
        else:
            highest = old.get(demo.HIGHEST_AMOUNT, 0)
            is_you = old.get(demo.HIGHEST_BIDDER) == user_id
        try:
            if accepted:
                # Once per accepted bid, however often it is acknowledged.
                self.state.write(
                    demo.user_pk(user_id),
                    sets={
                        demo.LAST_BID_AUCTION: auction,
                        demo.LAST_BID_AMOUNT: amount,
                        demo.LAST_BID_AT_MS: outcome.timestamp_ms,
                    },
                    adds={demo.BIDS_ACCEPTED: 1},
                    condition=f"NOT (#{demo.LAST_BID_AUCTION} = :auction AND "
                    f"#{demo.LAST_BID_AMOUNT} = :amount)",
                    condition_names=(demo.LAST_BID_AUCTION, demo.LAST_BID_AMOUNT),
                    condition_values={":auction": auction, ":amount": amount},
                    still_applies=lambda old: (
                        old.get(demo.LAST_BID_AUCTION) != auction
                        or old.get(demo.LAST_BID_AMOUNT) != amount
                    ),
                )
            else:
                self.state.write(demo.user_pk(user_id), sets={}, adds={demo.BIDS_REFUSED: 1})
        except (BotoCoreError, ClientError, StateWriteConflict) as exc:
            # The auction item decided the bid; the user's counters are a convenience.
            logger.warning("wsapi user state update failed after a bid: %s", exc)
        return {
            "type": demo.WS_REPLY_BID,
            "auction": auction,
            "amount": amount,
            "accepted": accepted,
            "highest": highest,
            "highestIsYou": is_you,
            **({} if accepted else {"reason": "not higher than the current highest bid"}),
        }

    def _home_call_fits(self, time_left_ms: Callable[[], int] | None) -> None:
        """Raise :class:`_HomeOutOfTime` rather than start a cross-Region call that Lambda's
        timeout could cut short (the client would hear nothing at all)."""
        remote = self.home is not self.local
        if remote and time_left_ms is not None and time_left_ms() < HOME_CALL_MAX_MS:
            raise _HomeOutOfTime(f"less than {HOME_CALL_MAX_MS} ms left in the invocation")

    def _record_bid(self, auction: str, amount: int, user_id: str, at_ms: int) -> None:
        # Immutable and keyed by amount (accepted amounts strictly increase): a retried put is a
        # no-op, and an acknowledged bid can be looked up after a failover. Written in the home
        # Region, beside the auction item that accepted it.
        try:
            self.home.client.put_item(
                TableName=self.home.table,
                Item={
                    model.PK: to_attr(demo.bid_pk(auction, amount)),
                    demo.AUCTION_ID: to_attr(auction),
                    demo.BID_AMOUNT: to_attr(amount),
                    demo.BID_BIDDER: to_attr(user_id),
                    demo.BID_AT_MS: to_attr(at_ms),
                    model.UPDATED_AT_MS: to_attr(at_ms),
                    model.WRITER_REGION: to_attr(self.home.region),
                },
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames=names(model.PK),
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise


class _HomeOutOfTime(Exception):
    """Not enough of the invocation left for a call to the auctions' home Region."""


# Answers that say the home's store is out of reach or overloaded, not that the request is wrong.
_TRANSIENT_CODES = frozenset(
    {
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)


def _home_unreachable(exc: BaseException) -> bool:
    """Whether a failed call to the home Region is an outage (retry later) rather than a
    fault of this deployment (access denied, no such table), which must not pass for one."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return error_code(exc) in _TRANSIENT_CODES or status >= 500
    return isinstance(exc, (BotoCoreError, StateWriteConflict, _HomeOutOfTime))


def _describe(exc: BaseException) -> str:
    return (error_code(exc) or "error") if isinstance(exc, ClientError) else type(exc).__name__

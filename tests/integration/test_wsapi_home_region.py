"""Bids across Regions: one home Region decides every bid, so none acknowledged is lost.

Global tables replicate asynchronously and settle concurrent writes to one item on the last
writer. A bid decided by a conditional write in each Region's own replica could therefore be
accepted in both, and replication would keep one of them: Alice's acknowledged 100, accepted in
the primary and not yet replicated, replaced by Bob's 90 accepted in the secondary after a
failover. Here both Regions' handlers run against moto's server, which keeps Regions apart, as
deployed: the same table name in ``us-east-1`` and ``us-west-2``, and no replication between
them, which is the window before a write replicates.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from streamfleet import model
from streamfleet.env import ConfigError
from streamfleet.lease.dynamo import from_item
from streamfleet.wsapi.handlers import WsApiHandlers
from streamfleet.wsapi.handlers.config import HandlerConfig, make_dynamodb_client
from streamfleet.wsapi.handlers.state_store import StateReplica
from streamfleet_auction import names as auction
from streamfleet_auction.auctions import Auctions
from streamfleet_auction.config import HOME_CALL_MAX_MS, AuctionConfig, make_home_client
from streamfleet_auction.extension import auction_extension
from streamfleet_dev.emulator.aws_proxy import AwsProxy
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables

HOME, OTHER = "us-east-1", "us-west-2"


class RecordingReplier:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def post(self, request_context: Any, connection_id: str, data: bytes) -> None:
        self.sent.append(json.loads(data))


@pytest.fixture
def replicas(moto) -> Iterator[tuple[str, str]]:
    """The state table (one name) in both Regions, and each Region's connections table."""
    suffix = uuid.uuid4().hex[:10]
    state, connections = f"test-wsstate-{suffix}", f"test-wsconn-{suffix}"
    for region in (HOME, OTHER):
        create_wsapi_tables(
            make_dynamodb_client(region), state_table=state, connections_table=connections
        )
    yield state, connections
    for region in (HOME, OTHER):
        delete_wsapi_tables(
            make_dynamodb_client(region), state_table=state, connections_table=connections
        )


def handlers_in(
    region: str,
    replicas: tuple[str, str],
    *,
    home: StateReplica | None = None,
    **kwargs: Any,
) -> WsApiHandlers:
    """The handlers of ``region`` with the demo auction installed, its home in ``HOME``."""
    state, connections = replicas
    return WsApiHandlers(
        HandlerConfig(state, connections, region),
        replier=RecordingReplier(),
        extensions=(auction_extension(AuctionConfig(home_region=HOME), home=home),),
        **kwargs,
    )


def auctions_of(handlers: WsApiHandlers) -> Auctions:
    return handlers.extension("auction").auctions  # type: ignore[attr-defined]


def bid_event(user: str, amount: int, request_id: str = "r") -> dict[str, Any]:
    """A ``bid`` message event as API Gateway delivers it, after the authorizer."""
    body = {"action": "bid", "auction": "a1", "amount": amount, "requestId": request_id}
    return {
        "requestContext": {"routeKey": "bid", "connectionId": "c1", "authorizer": {"sub": user}},
        "body": json.dumps(body),
    }


def items(region: str, table: str) -> dict[str, dict[str, Any]]:
    raw = make_dynamodb_client(region).scan(TableName=table, ConsistentRead=True)["Items"]
    return {item[model.PK]: item for item in (from_item(r) for r in raw)}


def test_a_lower_bid_in_the_other_region_never_replaces_an_acknowledged_one(
    replicas: tuple[str, str],
) -> None:
    state, _ = replicas
    home, other = handlers_in(HOME, replicas), handlers_in(OTHER, replicas)
    assert auctions_of(home).place_bid("alice", "a1", 100)["accepted"]
    # Not replicated yet: the secondary's replica has never seen Alice's bid.
    assert auction.auction_pk("a1") not in items(OTHER, state)
    bob = auctions_of(other).place_bid("bob", "a1", 90)
    assert (bob["accepted"], bob["highest"], bob["highestIsYou"]) == (False, 100, False)
    equal = auctions_of(other).place_bid("bob", "a1", 100)
    assert not equal["accepted"]
    higher = auctions_of(other).place_bid("bob", "a1", 101)
    assert higher["accepted"]
    # Every accepted bid, and its record, is in the home's replica; the other Region's replica
    # receives them only through replication (the user's own counters stay where they were).
    at_home = items(HOME, state)
    assert at_home[auction.auction_pk("a1")][auction.HIGHEST_BIDDER] == "bob"
    assert at_home[auction.auction_pk("a1")][auction.BID_COUNT] == 2
    recorded = {
        k for k in at_home if k.startswith(auction.bid_pk("a1", 0)[: -auction.BID_AMOUNT_DIGITS])
    }
    assert recorded == {auction.bid_pk("a1", 100), auction.bid_pk("a1", 101)}
    assert at_home[auction.bid_pk("a1", 101)][model.WRITER_REGION] == HOME
    elsewhere = items(OTHER, state)
    assert auction.auction_pk("a1") not in elsewhere
    assert elsewhere[auction.user_pk("bob")][auction.BIDS_ACCEPTED] == 1


def test_a_state_read_says_when_it_may_lag_the_home(replicas: tuple[str, str]) -> None:
    home, other = handlers_in(HOME, replicas), handlers_in(OTHER, replicas)
    auctions_of(home).place_bid("alice", "a1", 100)
    at_home = auctions_of(home).add_state("alice", "a1", {})["auction"]
    assert (at_home["highest"], at_home["homeRegion"], at_home["stale"]) == (100, HOME, False)
    elsewhere = auctions_of(other).add_state("alice", "a1", {})["auction"]
    assert (elsewhere["highest"], elsewhere["homeRegion"], elsewhere["stale"]) == (0, HOME, True)


def test_an_unreachable_home_refuses_the_bid_as_retryable_and_writes_nothing(
    replicas: tuple[str, str],
) -> None:
    state, _ = replicas

    class Down:
        def __getattr__(self, name: str) -> Any:
            def fail(**kwargs: Any) -> Any:
                raise ReadTimeoutError(endpoint_url=f"https://dynamodb.{HOME}.amazonaws.com")

            return fail

    unreachable = StateReplica(HOME, state, Down())
    other = handlers_in(OTHER, replicas, home=unreachable)
    assert other(bid_event("bob", 90, request_id="r1")) == {"statusCode": 200}
    reply = other.replier.sent[-1]
    assert (reply["type"], reply["error"], reply["field"]) == (
        "error",
        "home_unavailable",
        "auction",
    )
    assert reply["retryable"] is True and reply["requestId"] == "r1"
    assert HOME in reply["message"] and "retry" in reply["message"]
    assert auction.auction_pk("a1") not in items(OTHER, state)


def test_a_home_call_is_not_started_without_the_time_to_finish_it(
    replicas: tuple[str, str],
) -> None:
    """Lambda would end the invocation in the middle of the cross-Region call: the bidder
    would hear nothing. Refused as retryable instead, with nothing written anywhere."""
    state, _ = replicas
    other = handlers_in(OTHER, replicas)
    reply = other.on_message(bid_event("bob", 90), time_left_ms=lambda: HOME_CALL_MAX_MS - 1)
    assert reply == {"statusCode": 200}
    refused = other.replier.sent[-1]
    assert (refused["error"], refused["retryable"]) == ("home_unavailable", True)
    assert items(HOME, state) == {} and items(OTHER, state) == {}
    other.on_message(bid_event("bob", 90), time_left_ms=lambda: HOME_CALL_MAX_MS)
    assert other.replier.sent[-1]["accepted"] is True


def test_a_fault_of_the_deployment_is_not_told_as_an_outage_of_the_home(
    replicas: tuple[str, str],
) -> None:
    """A home table that does not exist (a wrong STATE_HOME_REGION, say) is no outage: the
    bidder is not told to wait for the home Region, and the log names the error."""
    missing = StateReplica(HOME, "no-such-table", make_home_client(HOME))
    other = handlers_in(OTHER, replicas, home=missing)
    other(bid_event("bob", 90))
    assert other.replier.sent[-1]["error"] == "unavailable"


class AnswerLostOnce:
    """A DynamoDB client whose first ``update_item`` applies and then loses its answer."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def update_item(self, **kwargs: Any) -> Any:
        answer = self.client.update_item(**kwargs)
        if not self.lost:
            self.lost = True
            raise ReadTimeoutError(endpoint_url="https://dynamodb.test")
        return answer


@pytest.mark.parametrize("region", [HOME, OTHER])
def test_a_bid_whose_answer_was_lost_is_acknowledged_when_retried(
    replicas: tuple[str, str], region: str
) -> None:
    """A bid's write applied but its answer was lost: the bidder's retry finds its own bid
    already highest and is told it was accepted, not refused as "not higher"."""
    state, _ = replicas
    home = StateReplica(HOME, state, AnswerLostOnce(make_dynamodb_client(HOME)))
    if region == HOME:
        handlers = handlers_in(HOME, replicas, dynamodb=home.client)
    else:
        handlers = handlers_in(OTHER, replicas, home=home)
    assert handlers(bid_event("alice", 100)) == {"statusCode": 200}
    lost = handlers.replier.sent[-1]
    expected = "unavailable" if region == HOME else "home_unavailable"
    assert (lost["type"], lost["error"], lost["retryable"]) == ("error", expected, True)
    handlers(bid_event("alice", 100))
    retried = handlers.replier.sent[-1]
    assert (retried["accepted"], retried["highest"], retried["highestIsYou"]) == (True, 100, True)
    at_home = items(HOME, state)
    assert at_home[auction.auction_pk("a1")][auction.BID_COUNT] == 1
    assert auction.bid_pk("a1", 100) in at_home
    # Someone else's equal bid is still refused.
    assert not auctions_of(handlers).place_bid("bob", "a1", 100)["accepted"]
    # The bidder's own counters moved once, however often the bid was acknowledged.
    handlers(bid_event("alice", 100))
    alice = items(region, state)[auction.user_pk("alice")]
    assert (alice[auction.BIDS_ACCEPTED], alice[auction.LAST_BID_AMOUNT]) == (1, 100)


def test_an_answer_lost_inside_the_sdks_own_retry_is_acknowledged(
    replicas: tuple[str, str], servers
) -> None:
    """The cross-Region update applied, its answer never came, and botocore retried within the
    same call: the retry finds the bid already there and the bidder is told it was accepted."""
    state, _ = replicas
    with AwsProxy(default_backend=servers["moto"].endpoint) as proxy:
        proxy.lose_first_answers(f"ADD #{auction.BID_COUNT}")
        client = boto3.session.Session().client(
            "dynamodb",
            region_name=HOME,
            endpoint_url=proxy.endpoint,
            config=Config(retries={"max_attempts": 2, "mode": "standard"}),
        )
        other = handlers_in(OTHER, replicas, home=StateReplica(HOME, state, client))
        reply = auctions_of(other).place_bid("alice", "a1", 100)
        assert proxy.lose_first_answers(None) == 1  # the first answer really was lost
    assert (reply["accepted"], reply["highestIsYou"]) == (True, True)
    at_home = items(HOME, state)
    assert at_home[auction.auction_pk("a1")][auction.BID_COUNT] == 1
    assert at_home[auction.bid_pk("a1", 100)][auction.BID_BIDDER] == "alice"
    assert items(OTHER, state)[auction.user_pk("alice")][auction.BIDS_ACCEPTED] == 1


def test_the_home_region_is_read_from_the_environment(replicas: tuple[str, str]) -> None:
    env = {auction.ENV_STATE_HOME_REGION: HOME}
    config = AuctionConfig.from_env(env)
    assert (config.home_region, config.home(OTHER)) == (HOME, HOME)
    assert AuctionConfig.from_env({}).home(OTHER) == OTHER
    with pytest.raises(ConfigError, match=f"^{auction.ENV_STATE_HOME_REGION}: 'east'"):
        AuctionConfig.from_env({auction.ENV_STATE_HOME_REGION: "east"})
    # The handlers' extension reads it from their environment.
    state, connections = replicas
    handlers = WsApiHandlers(
        HandlerConfig(state, connections, OTHER),
        replier=RecordingReplier(),
        extensions=(auction_extension(),),
        environment=env,
    )
    assert auctions_of(handlers).home.region == HOME
    with pytest.raises(ConfigError, match=auction.ENV_STATE_HOME_REGION):
        WsApiHandlers(
            HandlerConfig(state, connections, OTHER),
            replier=RecordingReplier(),
            extensions=(auction_extension(),),
            environment={auction.ENV_STATE_HOME_REGION: "east"},
        )

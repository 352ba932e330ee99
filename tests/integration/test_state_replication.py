"""The global-table stand-in between the local Regions' state tables: asynchronous, deletes
included, and concurrent writes settled on the replicator's own clock, as global tables settle
them on DynamoDB's write time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.lease.dynamo import from_item, to_item
from streamfleet.wsapi.handlers.config import make_dynamodb_client
from streamfleet_dev.emulator.global_tables import (
    ChangeFeed,
    ReplicaTable,
    ScanFeed,
    StateReplication,
    StreamFeed,
)
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables


@pytest.fixture
def two_regions(moto) -> Iterator[dict[str, str]]:
    """A state table with a stream in each of two regions of moto's server."""
    suffix = uuid.uuid4().hex[:8]
    tables = {}
    for region in ("us-east-1", "us-west-2"):
        tables[region] = f"test-repl-{region}-{suffix}"
        create_wsapi_tables(
            make_dynamodb_client(region),
            state_table=tables[region],
            connections_table=f"test-replc-{region}-{suffix}",
            stream=True,
        )
    yield tables
    for region, table in tables.items():
        delete_wsapi_tables(
            make_dynamodb_client(region),
            state_table=table,
            connections_table=f"test-replc-{region}-{suffix}",
        )


class Regional:
    """Each Region's DynamoDB and Streams clients, and its table's change feed of one kind."""

    def __init__(self, tables: dict[str, str], endpoint: str, feed_kind: str) -> None:
        self.tables = tables
        self.feed_kind = feed_kind
        self.clients = {region: AsyncClient("dynamodb", region_name=region) for region in tables}
        # Explicit: AWS_ENDPOINT_URL_DYNAMODB does not apply to the streams client.
        self.streams = {
            region: AsyncClient("dynamodbstreams", region_name=region, endpoint_url=endpoint)
            for region in tables
        }

    async def feed(self, region: str) -> ChangeFeed:
        if self.feed_kind == "scan":
            return ScanFeed(self.clients[region], self.tables[region])
        described = await self.clients[region].call("describe_table", TableName=self.tables[region])
        return StreamFeed(self.streams[region], described["Table"]["LatestStreamArn"])

    def close(self) -> None:
        for client in (*self.clients.values(), *self.streams.values()):
            client.close()


@pytest.fixture(params=["stream", "scan"])
def regional(two_regions: dict[str, str], moto, request) -> Iterator[Regional]:
    """The two Regions' clients, with a stream feed and with a scan feed (dynalite's kind)."""
    regions = Regional(two_regions, moto.endpoint, request.param)
    yield regions
    regions.close()


def state_item(pk: str, updated_at_ms: int, writer: str, **extra: object) -> dict:
    return to_item(
        {model.PK: pk, model.UPDATED_AT_MS: updated_at_ms, model.WRITER_REGION: writer, **extra}
    )


async def test_replication_is_last_writer_wins_by_its_own_clock_deletes_included(
    two_regions: dict[str, str], regional: Regional
) -> None:
    """Global tables settle concurrent writes on DynamoDB's own write time, whatever the items
    say, and replicate deletes: the local stand-in did neither (it compared the application's
    ``updated_at_ms`` and dropped deletes), so a convergence test could pass here for code that
    converges differently on AWS."""
    east, west = "us-east-1", "us-west-2"
    clients = regional.clients

    replication = StateReplication(
        [
            ReplicaTable(region, clients[region], two_regions[region], await regional.feed(region))
            for region in (east, west)
        ],
        interval=0.05,
    )

    async def put(region: str, item: dict) -> None:
        await clients[region].call("put_item", TableName=two_regions[region], Item=item)

    async def items(region: str) -> dict[str, dict]:
        page = await clients[region].call("scan", TableName=two_regions[region])
        return {item[model.PK]: item for item in (from_item(raw) for raw in page["Items"])}

    await put(east, state_item("AUCTION#a", 100, east, highest=5))
    await put(east, state_item("AUCTION#a", 101, east, highest=7))  # newer in the same poll
    await put(west, state_item("USER#u", 300, west, bids=9))
    assert await replication.poll_once() == 2
    assert (await items(west))["AUCTION#a"]["highest"] == 7  # only the newest version
    assert (await items(east))["USER#u"]["bids"] == 9
    # East writes later, with an older application timestamp: the later write wins.
    await put(east, state_item("USER#u", 200, east, bids=1))
    assert await replication.poll_once() == 1
    assert (await items(west))["USER#u"]["bids"] == 1
    # A delete is replicated like a write.
    await clients[east].call(
        "delete_item", TableName=two_regions[east], Key={model.PK: {"S": "AUCTION#a"}}
    )
    assert await replication.poll_once() == 1
    assert "AUCTION#a" not in await items(west)
    assert replication.stats.deletes == 1
    assert await replication.poll_once() == 0  # its own writes are not changes
    if regional.feed_kind == "stream":
        # Concurrent writes in both Regions: the one applied last wins in both, whichever
        # Region is read first (east is, and wrote last).
        await put(west, state_item("USER#v", 500, west, bids=5))
        await put(east, state_item("USER#v", 400, east, bids=4))
        await replication.poll_once()
        assert (await items(east))["USER#v"]["bids"] == 4
        assert (await items(west))["USER#v"]["bids"] == 4


class ReadTooEarly:
    """A feed whose next read comes before the write that follows it: it sees nothing."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.feed = feed
        self.blind = False

    async def read(self) -> list:
        if self.blind:
            self.blind = False
            return []
        return await self.feed.read()


async def test_a_change_that_finds_its_target_changed_unseen_is_weighed_again(
    two_regions: dict[str, str], regional: Regional
) -> None:
    """East's feed is read, east writes a, west writes b, west's feed is read: b cannot go over
    an east copy the replicator has not seen. It was dropped, and a then lost to b's copy in
    the west: the Regions differed for good. Now b waits, and one of the two wins in both."""
    east, west = "us-east-1", "us-west-2"
    clients = regional.clients
    feeds = {region: ReadTooEarly(await regional.feed(region)) for region in (east, west)}
    replication = StateReplication(
        [ReplicaTable(r, clients[r], two_regions[r], feeds[r]) for r in (east, west)],
        interval=0.05,
    )
    await replication.poll_once()
    feeds[east].blind = True
    for region, bids in ((east, 1), (west, 2)):
        await clients[region].call(
            "put_item",
            TableName=two_regions[region],
            Item=state_item("USER#x", 100, region, bids=bids),
        )
    await replication.poll_once()  # b finds east changed unseen: kept
    assert replication.pending
    await replication.poll_once()
    await replication.poll_once()
    copies = []
    for region in (east, west):
        page = await clients[region].call("scan", TableName=two_regions[region])
        copies += [from_item(raw) for raw in page["Items"]]
    assert len(copies) == 2 and copies[0] == copies[1]
    if regional.feed_kind == "stream":
        assert copies[0]["bids"] == 2  # west wrote last
    assert not replication.pending

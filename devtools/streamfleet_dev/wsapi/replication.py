"""A global table stand-in: asynchronous, last-writer-wins replication between two local tables.

Each :class:`Replicator` reads what changed in one region's state table (a :class:`ChangeFeed`:
the table's DynamoDB stream where the backend has one, moto; a polling scan where it has not,
dynalite) and writes each new image into the other region's table with a conditional put that
replaces only an older version, by ``(updated_at_ms, writer_region)``, as global tables resolve
conflicts on their own timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.lease.dynamo import from_item, is_condition_failure, names, to_attr

logger = logging.getLogger(__name__)


@dataclass
class ReplicationStats:
    shipped: int = 0
    # The destination already held a newer version (or this one): last-writer-wins kept it.
    conflicts: int = 0
    max_lag_ms: int = 0
    passes: int = 0


class ChangeFeed(Protocol):
    """Where a replicator learns what changed in its source table."""

    async def read(self) -> list[dict[str, Any]]:
        """Raw DynamoDB images of the items changed since the last read."""


class StreamFeed:
    """The table's DynamoDB stream (new images), read from the oldest record on: what global
    tables replicate from. Needs a backend with Streams (moto's server, AWS)."""

    def __init__(self, streams: AsyncClient, stream_arn: str):
        self.streams = streams
        self.stream_arn = stream_arn
        self._iterators: dict[str, str] = {}

    async def read(self) -> list[dict[str, Any]]:
        if not self._iterators:
            await self._open_shards()
        images: list[dict[str, Any]] = []
        for shard_id, iterator in list(self._iterators.items()):
            page = await self.streams.call("get_records", ShardIterator=iterator, Limit=1000)
            for record in page.get("Records", []):
                image = record.get("dynamodb", {}).get("NewImage")
                if record.get("eventName") != "REMOVE" and image:
                    images.append(image)
            if page.get("NextShardIterator"):
                self._iterators[shard_id] = page["NextShardIterator"]
            else:  # a closed shard: its children appear in the next describe
                del self._iterators[shard_id]
        return images

    async def _open_shards(self) -> None:
        description = await self.streams.call("describe_stream", StreamArn=self.stream_arn)
        for shard in description["StreamDescription"].get("Shards", []):
            response = await self.streams.call(
                "get_shard_iterator",
                StreamArn=self.stream_arn,
                ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON",
            )
            self._iterators[shard["ShardId"]] = response["ShardIterator"]


class ScanFeed:
    """A consistent scan per read, reporting the items whose version changed since the last one:
    for backends without Streams (dynalite). O(table) per read: fine for a drill."""

    def __init__(self, client: AsyncClient, table: str):
        self.client = client
        self.table = table
        self._seen: dict[str, tuple[int, str]] = {}

    async def read(self) -> list[dict[str, Any]]:
        images: list[dict[str, Any]] = []
        params: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = await self.client.call("scan", **params)
            for raw in page.get("Items", []):
                version = _version_of(from_item(raw) or {})
                pk = raw[model.PK]["S"]
                if version is not None and self._seen.get(pk) != version:
                    self._seen[pk] = version
                    images.append(raw)
            if "LastEvaluatedKey" not in page:
                return images
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _version_of(item: dict[str, Any]) -> tuple[int, str] | None:
    """An item's last-writer-wins version; ``None`` for anything that is not a state version
    (moto, for one, streams a bare key before the full image of an upsert)."""
    if model.UPDATED_AT_MS not in item:
        return None
    return int(item[model.UPDATED_AT_MS]), str(item.get(model.WRITER_REGION, ""))


class Replicator:
    """Applies one region's state-table changes to another's, asynchronously, last-writer-wins.

    Like a global table: every ``interval`` it reads what changed in the source (a
    :class:`ChangeFeed`) and writes each new image into the destination with a conditional put
    that replaces only an older version, by ``(updated_at_ms, writer_region)``. Images written
    *in* the destination region are never shipped back to it (that is how a change stops
    bouncing). Deletes are not replicated: the handlers never delete state items.
    """

    def __init__(
        self,
        *,
        feed: ChangeFeed,
        destination: AsyncClient,
        destination_table: str,
        destination_region: str,
        interval: float,
    ):
        self.feed = feed
        self.destination = destination
        self.destination_table = destination_table
        self.destination_region = destination_region
        self.interval = interval
        self.stats = ReplicationStats()
        self.paused = False

    async def run(self, stop: asyncio.Event) -> None:
        """Replicate until ``stop`` is set."""
        while not stop.is_set():
            if not self.paused:
                try:
                    await self.poll_once()
                except Exception as exc:  # a failed poll is retried by the next one
                    logger.warning("replication poll failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def poll_once(self) -> int:
        """Read what changed and apply it; the number of items shipped."""
        self.stats.passes += 1
        latest: dict[str, tuple[tuple[int, str], dict[str, Any]]] = {}
        for image in await self.feed.read():
            item = from_item(image) or {}
            version = _version_of(item)
            if version is None or version[1] == self.destination_region:
                continue
            pk = str(item[model.PK])
            # Only the newest version of an item matters: the conditional put refuses older
            # ones anyway, so a burst of bids on one auction costs one write, not hundreds.
            if pk not in latest or latest[pk][0] < version:
                latest[pk] = (version, image)
        # Different items are independent, so they are shipped concurrently (the client's
        # executor bounds the parallelism).
        results = await asyncio.gather(
            *(self._ship(version, image) for version, image in latest.values())
        )
        return sum(results)

    async def _ship(self, version: tuple[int, str], image: dict[str, Any]) -> int:
        try:
            await self.destination.call(
                "put_item",
                TableName=self.destination_table,
                Item=image,
                ConditionExpression=(
                    "attribute_not_exists(#pk) OR #updated_at_ms < :ts OR "
                    "(#updated_at_ms = :ts AND #writer_region < :region)"
                ),
                ExpressionAttributeNames=names(model.PK, model.UPDATED_AT_MS, model.WRITER_REGION),
                ExpressionAttributeValues={
                    ":ts": to_attr(version[0]),
                    ":region": to_attr(version[1]),
                },
            )
        except Exception as exc:
            if not is_condition_failure(exc):
                raise
            self.stats.conflicts += 1
            return 0
        self.stats.shipped += 1
        self.stats.max_lag_ms = max(self.stats.max_lag_ms, time.time_ns() // 1_000_000 - version[0])
        return 1


class MessageReplicator:
    """The messages table's global-table replication, one direction: every write of the source
    Region's replica (its DynamoDB stream, read from the start) applied to the destination's.

    Stored messages are immutable per ``(pk, seq)`` (a rewrite carries the same message), and
    only the active Region's fleet writes them, so there is nothing to resolve: puts and deletes
    are applied as they come, in stream order. Like a global table it is asynchronous; ``lag``
    says how far behind it is. The destination's own stream sees each applied write, which is
    what that Region's fan-out delivers (as a replica's stream carries replicated writes).
    """

    def __init__(
        self,
        *,
        streams: AsyncClient,
        stream_arn: str,
        destination: AsyncClient,
        destination_table: str,
        interval: float,
    ):
        self.streams = streams
        self.stream_arn = stream_arn
        self.destination = destination
        self.destination_table = destination_table
        self.interval = interval
        self.stats = ReplicationStats()
        self.paused = False
        self._iterators: dict[str, str | None] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Replicate until ``stop`` is set."""
        while not stop.is_set():
            shipped = 0
            if not self.paused:
                try:
                    shipped = await self.poll_once()
                except Exception as exc:  # the next poll tries again from the same iterator
                    logger.warning("message replication poll failed: %s", exc)
            if not shipped:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)

    async def poll_once(self) -> int:
        """Apply what the source stream has; the number of writes applied."""
        self.stats.passes += 1
        if not self._iterators:
            description = await self.streams.call("describe_stream", StreamArn=self.stream_arn)
            for shard in description["StreamDescription"].get("Shards", []):
                response = await self.streams.call(
                    "get_shard_iterator",
                    StreamArn=self.stream_arn,
                    ShardId=shard["ShardId"],
                    ShardIteratorType="TRIM_HORIZON",
                )
                self._iterators[shard["ShardId"]] = response["ShardIterator"]
        applied = 0
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None:
                continue
            page = await self.streams.call("get_records", ShardIterator=iterator, Limit=1000)
            records = page.get("Records") or []
            requests = []
            newest_ms = 0
            for record in records:
                change = record.get("dynamodb") or {}
                if record.get("eventName") == "REMOVE":
                    requests.append({"DeleteRequest": {"Key": change["Keys"]}})
                elif change.get("NewImage"):
                    requests.append({"PutRequest": {"Item": change["NewImage"]}})
                    received = change["NewImage"].get(model.MESSAGE_RECEIVED_AT_MS, {}).get("N")
                    newest_ms = max(newest_ms, int(received or 0))
            # Batches keep the stream's order: a put and a later delete of one item never
            # share a request (BatchWriteItem refuses two requests for one key anyway).
            for chunk in _ordered_chunks(requests):
                pending = chunk
                while pending:
                    response = await self.destination.call(
                        "batch_write_item", RequestItems={self.destination_table: pending}
                    )
                    pending = response.get("UnprocessedItems", {}).get(self.destination_table, [])
                applied += len(chunk)
            # Only after the records are applied: a failed write is retried from here.
            self._iterators[shard_id] = page.get("NextShardIterator")
            self.stats.shipped += len(requests)
            if newest_ms:
                self.stats.max_lag_ms = max(
                    self.stats.max_lag_ms, time.time_ns() // 1_000_000 - newest_ms
                )
        return applied


def _ordered_chunks(requests: list[dict[str, Any]], size: int = 25) -> list[list[dict[str, Any]]]:
    """Consecutive chunks of at most ``size`` requests, a new chunk whenever a key repeats (the
    later write must land after the earlier one)."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    keys: set[str] = set()
    for request in requests:
        body = request.get("PutRequest", {}).get("Item") or request["DeleteRequest"]["Key"]
        key = f"{body[model.PK]['S']}#{body[model.SEQ]['N']}"
        if len(current) >= size or key in keys:
            chunks.append(current)
            current, keys = [], set()
        current.append(request)
        keys.add(key)
    if current:
        chunks.append(current)
    return chunks

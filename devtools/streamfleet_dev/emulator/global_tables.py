"""A global table stand-in: asynchronous replication between local tables, resolved as global
tables resolve it.

:class:`StateReplication` reads what changed in every Region's state table (a
:class:`ChangeFeed` per Region: the table's DynamoDB stream where the backend has one, moto; a
polling scan where it has not, dynalite) and applies each change, writes and deletes alike, to
the other Regions' tables. Concurrent changes to one item settle on the **last writer by the
replicator's own clock**: each change is stamped with when it was applied in its Region (the
stream record's ``ApproximateCreationDateTime``, or when the scan first saw it), never with an
attribute of the item, as DynamoDB decides on its own write time and ignores the application's
timestamps. A change is applied to a Region only if that Region's copy is older by that clock,
and only if the copy's scalar attributes are still those the replicator last saw there (every
write of the handlers moves ``updated_at_ms``); a change that finds the copy changed unseen
waits until that change has been read, and the newer of the two wins everywhere.

With a scan feed (dynalite) a change is stamped when a scan first sees it, so two writes to
one item in different Regions within one polling interval are ordered by which Region was
scanned last, not by when they were applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.lease.dynamo import is_condition_failure, names

logger = logging.getLogger(__name__)
SHARD_REFRESH_SECONDS = 5.0  # how often a stream's shard list is read again


@dataclass
class ReplicationStats:
    shipped: int = 0  # writes applied to another Region
    deletes: int = 0  # of which deletes
    # The other Region's copy was newer by the replicator's clock (or changed unseen): kept.
    conflicts: int = 0
    max_lag_ms: int = 0  # from a change's stamp to its application elsewhere
    passes: int = 0


@dataclass(frozen=True)
class Change:
    """One item's new image (``None``: deleted) and when its Region applied it (epoch s)."""

    pk: str
    image: dict[str, Any] | None
    applied_at: float


class ChangeFeed(Protocol):
    """Where a replicator learns what changed in one Region's table."""

    async def read(self) -> list[Change]:
        """The changes since the last read, in the order they were applied."""


class StreamFeed:
    """The table's DynamoDB stream (new images, and removes), read from the oldest record on:
    what global tables replicate from. Needs a backend with Streams (moto's server, AWS)."""

    def __init__(self, streams: AsyncClient, stream_arn: str):
        self.streams = streams
        self.stream_arn = stream_arn
        self._iterators: dict[str, str | None] = {}  # None: a closed shard read to its end
        self._described_at = float("-inf")

    async def read(self) -> list[Change]:
        if time.monotonic() - self._described_at > SHARD_REFRESH_SECONDS:
            await self._open_shards()  # shards that appeared since (a split), from their start
            self._described_at = time.monotonic()
        changes: list[Change] = []
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None:
                continue
            page = await self.streams.call("get_records", ShardIterator=iterator, Limit=1000)
            for record in page.get("Records", []):
                data = record.get("dynamodb", {})
                keys = data.get("Keys") or data.get("NewImage") or {}
                if model.PK not in keys:
                    continue
                removed = record.get("eventName") == "REMOVE"
                if not removed and set(data.get("NewImage") or {}) <= {model.PK}:
                    # No image to apply: a keys-only record, or moto's bare key ahead of the
                    # full image of an item an update created.
                    continue
                created = data.get("ApproximateCreationDateTime")
                applied_at = created.timestamp() if hasattr(created, "timestamp") else time.time()
                image = None if removed else data["NewImage"]
                changes.append(Change(keys[model.PK]["S"], image, applied_at))
            if page.get("NextShardIterator"):
                self._iterators[shard_id] = page["NextShardIterator"]
            else:  # a closed shard: read to its end
                self._iterators[shard_id] = None
        return changes

    async def _open_shards(self) -> None:
        description = await self.streams.call("describe_stream", StreamArn=self.stream_arn)
        for shard in description["StreamDescription"].get("Shards", []):
            if shard["ShardId"] in self._iterators:
                continue
            response = await self.streams.call(
                "get_shard_iterator",
                StreamArn=self.stream_arn,
                ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON",
            )
            self._iterators[shard["ShardId"]] = response["ShardIterator"]


class ScanFeed:
    """A consistent scan per read, reporting every item whose image changed since the last read
    and every item gone since, stamped when this scan saw them: for backends without Streams
    (dynalite). O(table) per read: fine for a drill."""

    def __init__(self, client: AsyncClient, table: str):
        self.client = client
        self.table = table
        self._seen: dict[str, str] = {}  # pk -> canonical image

    async def read(self) -> list[Change]:
        now = time.time()
        current: dict[str, tuple[str, dict[str, Any]]] = {}
        params: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = await self.client.call("scan", **params)
            for raw in page.get("Items", []):
                current[raw[model.PK]["S"]] = (_canonical(raw), raw)
            if "LastEvaluatedKey" not in page:
                break
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        changes = [
            Change(pk, raw, now)
            for pk, (text, raw) in current.items()
            if self._seen.get(pk) != text
        ]
        changes += [Change(pk, None, now) for pk in self._seen if pk not in current]
        self._seen = {pk: text for pk, (text, _) in current.items()}
        return changes


@dataclass
class ReplicaTable:
    """One Region's replica: where its changes are read and where others' are applied."""

    region: str
    client: AsyncClient
    table: str
    feed: ChangeFeed


@dataclass
class _Held:
    """What the replicator knows a replica holds for one item."""

    stamp: tuple[float, int]  # (applied at, tie-breaker): the item's last-writer-wins version
    image: str | None  # canonical image, None: absent


@dataclass
class _Pending:
    """A change still to be applied to one Region (kept until it is, or is superseded)."""

    stamp: tuple[float, int]
    text: str | None
    image: dict[str, Any] | None


@dataclass
class StateReplication:
    """Every Region's state table replicated to every other one (see the module docstring).

    ``poll_once`` reads each Region's feed, stamps what is new, and applies the newest change of
    each item to every other Region whose copy is older. A change waits in :attr:`pending` until
    it is applied or a newer one supersedes it: one that found its target changed unseen is
    tried again once that change has been read, and a failed read or write loses nothing.
    """

    replicas: list[ReplicaTable]
    interval: float
    stats: ReplicationStats = field(default_factory=ReplicationStats)
    paused: bool = False
    pending: dict[tuple[str, str], _Pending] = field(default_factory=dict)  # (target, pk)
    _held: dict[tuple[str, str], _Held] = field(default_factory=dict)
    # (region, pk) -> images the replicator wrote there whose stream records are not read yet
    _echoes: dict[tuple[str, str], list[str | None]] = field(default_factory=dict)
    _ties: itertools.count = field(default_factory=itertools.count)

    async def run(self, stop: asyncio.Event) -> None:
        """Replicate until ``stop`` is set."""
        while not stop.is_set():
            if not self.paused:
                try:
                    await self.poll_once()
                except Exception as exc:  # what was read waits in `pending` for the next poll
                    logger.warning("replication poll failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def poll_once(self) -> int:
        """Read what changed everywhere and apply it elsewhere; the number of writes applied."""
        self.stats.passes += 1
        for replica in self.replicas:
            try:
                changes = await replica.feed.read()
            except Exception as exc:  # the other Regions' changes still go out
                logger.warning("replication: reading %s failed: %s", replica.region, exc)
                continue
            for change in changes:
                self._take(replica.region, change)
        keys = list(self.pending)
        results = await asyncio.gather(
            *(self._apply(target, pk) for target, pk in keys), return_exceptions=True
        )
        applied = 0
        for (target, pk), result in zip(keys, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("replication: applying %s to %s failed: %s", pk, target, result)
            else:
                applied += result
        return applied

    def _take(self, region: str, change: Change) -> None:
        """Stamp a change read from ``region`` and queue it for every other Region."""
        key = (region, change.pk)
        text = None if change.image is None else _canonical(change.image)
        echoes = self._echoes.get(key)
        if echoes and text in echoes:
            echoes.remove(text)  # the replicator's own write, read back where it wrote it
            return
        stamp = (change.applied_at, next(self._ties))
        self._held[key] = _Held(stamp, text)
        for target in self.replicas:
            if target.region == region:
                continue
            queued = self.pending.get((target.region, change.pk))
            if queued is None or queued.stamp < stamp:
                self.pending[(target.region, change.pk)] = _Pending(stamp, text, change.image)

    async def _apply(self, target_region: str, pk: str) -> int:
        """Apply the change pending for ``(target_region, pk)``: 1 if written, 0 otherwise."""
        change = self.pending[(target_region, pk)]
        target = next(r for r in self.replicas if r.region == target_region)
        key = (target_region, pk)
        held = self._held.get(key)
        if held is not None and held.stamp > change.stamp:
            del self.pending[key]  # the target's own later write wins, and is queued itself
            self.stats.conflicts += 1
            return 0
        # Only over the copy last seen there: an unseen write in the target is newer.
        condition, values, attribute_names = _unchanged(None if held is None else held.image)
        request: dict[str, Any] = {
            "TableName": target.table,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": attribute_names,
        }
        if values:
            request["ExpressionAttributeValues"] = values
        try:
            if change.image is None:
                await target.client.call("delete_item", Key={model.PK: {"S": pk}}, **request)
            else:
                await target.client.call("put_item", Item=change.image, **request)
        except Exception as exc:
            if not is_condition_failure(exc):
                raise  # still pending: the next poll tries again
            # Changed unseen: kept, and weighed again once that change has been read.
            self.stats.conflicts += 1
            return 0
        if self.pending.get(key) is change:
            del self.pending[key]
        self._held[key] = _Held(change.stamp, change.text)
        self._echoes.setdefault(key, []).append(change.text)
        self.stats.shipped += 1
        self.stats.deletes += change.image is None
        lag_ms = int((time.time() - change.stamp[0]) * 1000)
        self.stats.max_lag_ms = max(self.stats.max_lag_ms, lag_ms)
        return 1


def _canonical(image: dict[str, Any]) -> str:
    return json.dumps(image, sort_keys=True)


def _unchanged(expected: str | None) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A condition that holds only while the item is ``expected`` (``None``: absent): each of
    its scalar attributes (every write of the handlers moves ``updated_at_ms``) unchanged."""
    if expected is None:
        return "attribute_not_exists(#pk)", {}, names(model.PK)
    image = json.loads(expected)
    scalars = {k: v for k, v in image.items() if set(v) <= {"S", "N", "BOOL"}}
    parts, values, attribute_names = [], {}, {}
    for index, (name, value) in enumerate(sorted(scalars.items())):
        attribute_names[f"#a{index}"] = name
        values[f":v{index}"] = value
        parts.append(f"#a{index} = :v{index}")
    return " AND ".join(parts), values, attribute_names


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

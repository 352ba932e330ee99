"""Persisting upstream messages: batched across connections, stored under ``(pk, seq)``.

Writing under the message's own ``seq`` makes a replay idempotent: a new owner that resumes a
little behind rewrites the same items, so nothing is duplicated. The stored log of a stream is
``origin + 1 .. newest`` without a hole, with two exceptions that the owners repair: a batch
that landed only partly before its owner failed (the next owner resumes from the end of the
contiguous run and rewrites everything after it), and a stream stopped before that happened
(the worker that seals its log removes what lies past the hole; see ``connection.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import ClientError

from .. import buffering, model
from ..aws import AsyncClient
from ..backoff import full_jitter
from ..lease import SessionKeeper, SessionLost
from ..lease.dynamo import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    is_transient,
    retry_until,
    to_attr,
    to_item,
)
from ..lease.errors import StoreUnavailable
from ..waiting import wait_at_most
from .protocol import UpstreamMessage

# Above every position a stream can store (model.log_position's largest).
NEWEST_POSITION = model.log_position(model.MAX_EPOCH, model.MAX_SEQ)
MAX_BATCH_WRITE_ITEMS = 25  # DynamoDB's limit per BatchWriteItem request
# At most this many messages per flush (80 requests): one flush never holds the event loop for
# long, whatever the backlog; the next flush follows at once.
MAX_ITEMS_PER_FLUSH = 2000
# An upper bound of a number's stored size (DynamoDB counts about one byte per two digits).
_NUMBER_BYTES = 21


def item_bytes(item: dict[str, Any]) -> int:
    """An upper bound of ``item``'s size as DynamoDB counts it against its 400 KB limit."""
    size = 0
    for name, value in item.items():
        size += len(name.encode("utf-8"))
        size += len(value.encode("utf-8")) if isinstance(value, str) else _NUMBER_BYTES
    return size


def run_end(stored: list[tuple[int, int | None]], after: int) -> int:
    """The end of the run that continues ``after`` through ``stored`` (``(seq, prev_seq)``
    ascending, all above ``after``): see :meth:`MessageSink.contiguous_end`."""
    # The lowest prev_seq at or after each position: a later message that follows the end
    # vouches for everything stored before it.
    lowest_prev: list[int | None] = [None] * (len(stored) + 1)
    for index in range(len(stored) - 1, -1, -1):
        prev, later = stored[index][1], lowest_prev[index + 1]
        lowest_prev[index] = prev if later is None else later if prev is None else min(prev, later)
    end = after
    for index, (seq, prev_seq) in enumerate(stored):
        follows = seq == end + 1 if prev_seq is None else prev_seq <= end
        vouched = lowest_prev[index] is not None and lowest_prev[index] <= end
        if not (follows or vouched):
            return end
        end = seq
    return end


def _refused(error: BaseException) -> bool:
    """DynamoDB's definite "no" to a request (an item too big, a number out of range): a
    ``BatchWriteItem`` fails whole for one such item."""
    return isinstance(error, ClientError) and not is_transient(error)


class MessageOwner(Protocol):
    """The connection a message came from, told when its messages are stored or lost."""

    pk: str
    session_version: int

    def stored(self, count: int, up_to_seq: int, size: int) -> None: ...

    def storage_failed(self, error: Exception) -> None: ...


@dataclass(frozen=True)
class _Pending:
    owner: MessageOwner
    message: UpstreamMessage
    received_at_ms: int
    prev_seq: int | None
    prev_expires_at: int | None


class MessageSink:
    """Queues messages from every connection and writes them in ``BatchWriteItem`` requests.

    One flush at a time, so a connection's stored position only ever moves over a contiguous
    run of its messages: a checkpoint can never jump a gap. Every write is sent before the
    holder's deadline; past it nothing is sent (a paused worker writes nothing). Once a
    connection's write has failed, nothing more of it is written, and :meth:`settle` returns
    only when none of its writes is in flight any more, so a connection released after it never
    has a write land behind its back.
    """

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        worker_id: str,
        session: SessionKeeper,
        flush_every: float,
        retention_seconds: int | None = None,
        parallel_requests: int = 8,
        max_buffered_bytes: int = buffering.DEFAULT_MAX_WORKER_BUFFERED_BYTES,
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self._worker_id = worker_id
        self._session = session
        self._flush_every = flush_every
        self._retention_seconds = retention_seconds
        self._parallel = asyncio.Semaphore(parallel_requests)
        self._queue: list[_Pending] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._closed: set[int] = set()  # owners whose messages are no longer written
        self._in_flight: dict[int, int] = {}
        self._settled = asyncio.Condition()
        self._queued_total = 0
        self._taken_total = 0
        self.stored_total = 0
        # Bytes of data queued or being written, all connections together. At the bound,
        # ``room`` is cleared and the connections stop reading until a write has finished.
        self._max_buffered_bytes = max_buffered_bytes
        self.buffered_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self._last_expiry: dict[int, int | None] = {}  # by owner: its last message's TTL

    def add(
        self, owner: MessageOwner, message: UpstreamMessage, prev_seq: int | None = None
    ) -> None:
        """Queue a message that follows ``prev_seq`` in its stream (nothing was received in
        between); it is written within ``flush_every`` (sooner when 25 are queued)."""
        if id(owner) in self._closed:
            return
        received_at_ms = self._session.clock.wall_ms()
        # What this connection received just before (None after a resume: nothing yet).
        prev_expires_at = self._last_expiry.get(id(owner)) if prev_seq is not None else None
        self._last_expiry[id(owner)] = self._expires_at(received_at_ms)
        self._queue.append(_Pending(owner, message, received_at_ms, prev_seq, prev_expires_at))
        self._buffered(message.data_bytes)
        self._queued_total += 1
        if len(self._queue) >= MAX_BATCH_WRITE_ITEMS:
            self._wake.set()

    async def run(self) -> None:
        """The flusher loop; cancel it to stop."""
        while True:
            await wait_at_most(self._wake.wait(), self._flush_every)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write everything queued so far; returns once it is stored (or has failed), including
        messages a flush already under way had taken."""
        target = self._queued_total
        await self._flush_once()  # waits for a flush under way first: it may hold ours
        while self._taken_total < target and self._queue:
            await self._flush_once()

    async def settle(self, owner: MessageOwner) -> None:
        """Stop writing ``owner``'s messages: drop what is queued, and wait until none of its
        writes is in flight. Call it before giving the connection up."""
        key = id(owner)
        self._closed.add(key)
        self._last_expiry.pop(key, None)
        self._buffered(-sum(p.message.data_bytes for p in self._queue if p.owner is owner))
        self._queue = [p for p in self._queue if p.owner is not owner]
        async with self._settled:
            await self._settled.wait_for(lambda: not self._in_flight.get(key))
        self._closed.discard(key)

    def _buffered(self, change: int) -> None:
        self.buffered_bytes += change
        if self.buffered_bytes < self._max_buffered_bytes:
            self.room.set()
        else:
            self.room.clear()

    async def _flush_once(self) -> None:
        async with self._lock:
            batch = self._queue[:MAX_ITEMS_PER_FLUSH]
            del self._queue[:MAX_ITEMS_PER_FLUSH]
            self._taken_total += len(batch)
            try:
                await self._write_batch(batch)
            finally:  # written, failed or dropped: no longer held here
                self._buffered(-sum(p.message.data_bytes for p in batch))

    async def _write_batch(self, batch: list[_Pending]) -> None:
        current = self._session.version
        for pending in batch:
            owner = pending.owner
            if owner.session_version != current and id(owner) not in self._closed:
                # Held under a session that is over: write nothing of it, ever again.
                self._close(owner, SessionLost(f"{owner.pk}: its session is over"))
        batch = [p for p in batch if id(p.owner) not in self._closed]
        if not batch:
            return
        owners = {id(p.owner): p.owner for p in batch}
        for key in owners:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
        chunks = [
            batch[start : start + MAX_BATCH_WRITE_ITEMS]
            for start in range(0, len(batch), MAX_BATCH_WRITE_ITEMS)
        ]
        try:
            # Every chunk runs to its end (success or failure) before anyone is told: a
            # sibling chunk must not keep writing after its connection was given up.
            results = await asyncio.gather(*(self._write_judged(chunk) for chunk in chunks))
        finally:
            for key in owners:
                self._in_flight[key] -= 1
                if not self._in_flight[key]:
                    del self._in_flight[key]
            async with self._settled:
                self._settled.notify_all()
        failed: dict[int, BaseException] = {}
        for result in results:
            for pending, error in result:
                failed.setdefault(id(pending.owner), error)
        latest: dict[int, tuple[int, int, int]] = {}
        for pending in batch:
            key = id(pending.owner)
            if key not in failed and key not in self._closed:
                count, _, size = latest.get(key, (0, 0, 0))
                latest[key] = (count + 1, pending.message.seq, size + pending.message.data_bytes)
        for key, error in failed.items():
            self._close(owners[key], error)
        for key, (count, seq, size) in latest.items():
            self.stored_total += count
            owners[key].stored(count, seq, size)

    def _close(self, owner: MessageOwner, error: BaseException) -> None:
        """No message of ``owner`` is written from now on; it learns why."""
        self._closed.add(id(owner))
        owner.storage_failed(error if isinstance(error, Exception) else RuntimeError(error))

    def item(
        self,
        pk: str,
        message: UpstreamMessage,
        received_at_ms: int,
        prev_seq: int | None = None,
        prev_expires_at: int | None = None,
    ) -> dict[str, Any]:
        """The messages-table item that stores ``message`` of ``pk`` (plain values)."""
        item: dict[str, Any] = {
            model.PK: pk,
            model.SEQ: message.seq,
            model.MESSAGE_DATA: message.data,
            model.MESSAGE_RECEIVED_AT_MS: received_at_ms,
            model.MESSAGE_WORKER: self._worker_id,
        }
        if message.json:
            item[model.MESSAGE_FORMAT] = model.MESSAGE_FORMAT_JSON
        if prev_seq is not None:
            item[model.MESSAGE_PREV_SEQ] = prev_seq
        if prev_expires_at is not None:
            item[model.MESSAGE_PREV_EXPIRES_AT] = prev_expires_at
        expires_at = self._expires_at(received_at_ms)
        if expires_at is not None:
            item[model.MESSAGE_EXPIRES_AT] = expires_at
        return item

    def _expires_at(self, received_at_ms: int) -> int | None:
        """The TTL of a message received at ``received_at_ms`` (``None``: kept for ever)."""
        if not self._retention_seconds:
            return None
        return received_at_ms // 1000 + self._retention_seconds

    def fits(self, pk: str, message: UpstreamMessage) -> bool:
        """Whether ``message`` fits in one DynamoDB item: checked before it is queued, so that a
        message that cannot be stored never fails a batch it shares with other streams."""
        return item_bytes(self.item(pk, message, 0)) <= model.DYNAMODB_MAX_ITEM_BYTES

    def _item(self, pending: _Pending) -> dict[str, Any]:
        return self.item(
            pending.owner.pk,
            pending.message,
            pending.received_at_ms,
            pending.prev_seq,
            pending.prev_expires_at,
        )

    async def _write_judged(self, chunk: list[_Pending]) -> list[tuple[_Pending, BaseException]]:
        """Write ``chunk``; returns the messages that failed, each with its error. A chunk that
        DynamoDB refuses outright is written again stream by stream, so that only the stream
        whose message it cannot take fails, never the others that shared its request."""
        try:
            await self._write(chunk)
            return []
        except Exception as exc:
            error = exc
        by_owner: dict[int, list[_Pending]] = {}
        for pending in chunk:
            by_owner.setdefault(id(pending.owner), []).append(pending)
        if len(by_owner) == 1 or not _refused(error):
            return [(pending, error) for pending in chunk]
        parts = list(by_owner.values())
        results = await asyncio.gather(
            *(self._write(part) for part in parts), return_exceptions=True
        )
        return [
            (pending, result)
            for part, result in zip(parts, results, strict=True)
            if isinstance(result, BaseException)
            for pending in part
        ]

    async def _write(self, chunk: list[_Pending]) -> None:
        async with self._parallel:
            # Serialised here, one chunk at a time, so a big backlog never blocks the loop.
            requests = [{"PutRequest": {"Item": to_item(self._item(p))}} for p in chunk]
            await self._batch_write(
                requests, what="store messages", version=chunk[0].owner.session_version
            )

    async def _batch_write(
        self, requests: list[dict[str, Any]], *, what: str, version: int | None = None
    ) -> None:
        """One ``BatchWriteItem``, unprocessed items retried, never sent past the deadline of
        the session the messages were received under (``version``: the current one if none)."""
        version = version if version is not None else self._session.require_live()

        def live() -> None:
            self._session.require_live(version)

        attempt = 0
        while requests:
            live()  # never write past the holder's deadline...
            response = await retry_until(
                lambda requests=requests: self._dynamodb.call(
                    "batch_write_item",
                    RequestItems={self._table: requests},
                    guard=live,  # ...checked again at the send: the session may have moved on
                ),
                deadline=self._session.deadline,
                clock=self._session.clock,
                what=what,
            )
            requests = response.get("UnprocessedItems", {}).get(self._table, [])
            if requests:
                delay = full_jitter(attempt, BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
                if self._session.seconds_left() <= delay:
                    raise StoreUnavailable(f"{what}: unprocessed until the deadline")
                await asyncio.sleep(delay)
                attempt += 1

    # -- the stored log ------------------------------------------------------------------------

    async def _stored_after(self, pk: str, after: int):
        """``(seq, prev_seq)`` of what is stored for ``pk`` above ``after``, ascending, page by
        page (consistent reads); ``prev_seq`` is ``None`` on items stored without one."""
        params: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#pk = :pk AND #seq > :after",
            "ExpressionAttributeNames": {
                "#pk": model.PK,
                "#seq": model.SEQ,
                "#prev": model.MESSAGE_PREV_SEQ,
            },
            "ExpressionAttributeValues": {":pk": to_attr(pk), ":after": to_attr(after)},
            "ConsistentRead": True,
            "ProjectionExpression": "#pk, #seq, #prev",
        }
        while True:
            response = await retry_until(
                lambda params=dict(params): self._dynamodb.call("query", **params),
                deadline=self._session.deadline,
                clock=self._session.clock,
                what=f"stored seqs of {pk}",
            )
            yield [
                (
                    int(item[model.SEQ]["N"]),
                    int(item[model.MESSAGE_PREV_SEQ]["N"])
                    if model.MESSAGE_PREV_SEQ in item
                    else None,
                )
                for item in response.get("Items", [])
            ]
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            params["ExclusiveStartKey"] = last

    async def last_stored(self, pk: str, at_most: int) -> tuple[int, int | None] | None:
        """``(position, expires_at)`` of the newest message stored for ``pk`` at or below
        ``at_most`` (``None``: none): what a resuming owner's first message follows."""
        response = await retry_until(
            lambda: self._dynamodb.call(
                "query",
                TableName=self._table,
                KeyConditionExpression="#pk = :pk AND #seq <= :at_most",
                ExpressionAttributeNames={
                    "#pk": model.PK,
                    "#seq": model.SEQ,
                    "#expires": model.MESSAGE_EXPIRES_AT,
                },
                ExpressionAttributeValues={":pk": to_attr(pk), ":at_most": to_attr(at_most)},
                ProjectionExpression="#seq, #expires",
                ScanIndexForward=False,
                Limit=1,
                ConsistentRead=True,
            ),
            deadline=self._session.deadline,
            clock=self._session.clock,
            what=f"the last stored message of {pk}",
        )
        items = response.get("Items", [])
        if not items:
            return None
        expires = items[0].get(model.MESSAGE_EXPIRES_AT)
        return int(items[0][model.SEQ]["N"]), int(expires["N"]) if expires else None

    def follows(self, owner: MessageOwner, expires_at: int | None) -> None:
        """``owner``'s next message follows a stored one that expires at ``expires_at``: recorded
        as its ``prev_expires_at``, so a reader can tell when a hole before it is unfillable."""
        self._last_expiry[id(owner)] = expires_at

    async def newest_stored(self, pk: str) -> int | None:
        """The highest position stored for ``pk`` (``None``: nothing)."""
        last = await self.last_stored(pk, NEWEST_POSITION)
        return None if last is None else last[0]

    async def contiguous_end(self, pk: str, after: int) -> int:
        """The last seq of the run stored without a hole right after ``after`` (``after`` itself
        if the next message is missing): where a new owner resumes, however rarely the checkpoint
        was written. Reads what lies past the checkpoint, usually a page or less.

        A message follows the run when its writer received nothing after the run's end and
        before it (its ``prev_seq`` is at most the end): a gap the upstream left, or a frame that
        was refused, is part of the log, not a hole. So does a message stored before one that
        follows the end: what a writer left before a gap its successor's upstream then declared
        (a partly landed batch, then a resume that skipped past it) can never be filled. Only a
        message that was received and may still be stored (a batch that landed in part, nothing
        past it vouched for) ends the run.
        """
        stored = [item async for page in self._stored_after(pk, after) for item in page]
        return run_end(stored, after)

    async def close_holes(self, pk: str, after: int, below: int | None = None) -> tuple[int, int]:
        """Record every hole left in the log of ``pk`` above ``after`` (and below ``below``) as a
        gap: the message after each hole gets the end of the run before it as its ``prev_seq``.
        Returns the end of the run now (without ``below``: the log's newest message) and how many
        holes were closed.

        For holes nothing can fill any more (the upstream, reached, replayed all it still has).
        What is stored past them stays: readers may have received it, and a message written
        again at one of its seqs would then be dropped as a duplicate it is not.
        Only the owner of ``pk`` may call it.
        """
        stored = [item async for page in self._stored_after(pk, after) for item in page]
        if below is not None:
            stored = [(seq, prev) for seq, prev in stored if seq < below]
        end, closed = after, 0
        while stored:
            end = run_end(stored, end)
            stored = [(seq, prev) for seq, prev in stored if seq > end]
            if not stored:
                break
            seq = stored[0][0]
            if not await self._declare_gap(pk, seq, end):
                del stored[0]  # expired meanwhile: the hole goes on to the next message
                continue
            stored[0] = (seq, end)
            closed += 1
        return end, closed

    async def _declare_gap(self, pk: str, seq: int, end: int) -> bool:
        """Record that the message at ``seq`` follows ``end`` (nothing between can be stored):
        the item written again with that ``prev_seq``, with the worker's own two permissions
        (``Query``, ``BatchWriteItem``); ``False`` if it is gone. Only its owner writes it."""
        item = await self._stored_item(pk, seq)
        if item is None:
            return False
        item[model.MESSAGE_PREV_SEQ] = to_attr(end)
        item.pop(model.MESSAGE_PREV_EXPIRES_AT, None)  # that of the message no longer before it
        await self._batch_write(
            [{"PutRequest": {"Item": item}}], what=f"record the gap before {seq} of {pk}"
        )
        return True

    async def _stored_item(
        self, pk: str, position: int, projection: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        """The item stored for ``pk`` at ``position`` (consistent; only the attributes named in
        ``projection``, if given), or ``None``."""
        params: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#pk = :pk AND #seq = :position",
            "ExpressionAttributeNames": {"#pk": model.PK, "#seq": model.SEQ},
            "ExpressionAttributeValues": {":pk": to_attr(pk), ":position": to_attr(position)},
            "ConsistentRead": True,
        }
        if projection:
            params["ExpressionAttributeNames"].update(projection)
            params["ProjectionExpression"] = ", ".join(projection)
        response = await retry_until(
            lambda: self._dynamodb.call("query", **params),
            deadline=self._session.deadline,
            clock=self._session.clock,
            what=f"the message at {position} of {pk}",
        )
        items = response.get("Items") or []
        return items[0] if items else None

    async def stored_message(self, pk: str, position: int) -> tuple[str, bool] | None:
        """``(data, json)`` of the message stored for ``pk`` at ``position`` (consistent), or
        ``None``: nothing is stored there."""
        item = await self._stored_item(
            pk, position, {"#data": model.MESSAGE_DATA, "#format": model.MESSAGE_FORMAT}
        )
        if item is None:
            return None
        data = item.get(model.MESSAGE_DATA, {}).get("S")
        json_format = item.get(model.MESSAGE_FORMAT, {}).get("S") == model.MESSAGE_FORMAT_JSON
        return (data, json_format) if data is not None else None

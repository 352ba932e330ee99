"""Persisting upstream messages: batched across connections, stored under ``(pk, seq)``.

Writing under the message's own ``seq`` makes a replay idempotent: a new owner that resumes from
a checkpoint a little behind rewrites the same items, so nothing is duplicated or lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from .. import model
from ..aws import AsyncClient
from ..lease import SessionKeeper, SessionLost
from ..lease.dynamo import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    full_jitter,
    retry_until,
    to_attr,
    to_item,
)
from ..lease.errors import StoreUnavailable
from .protocol import UpstreamMessage

MAX_BATCH_WRITE_ITEMS = 25  # DynamoDB's limit per BatchWriteItem request


class MessageOwner(Protocol):
    """The connection a message came from, told when its messages are stored or lost."""

    pk: str
    session_version: int

    def stored(self, count: int, up_to_seq: int) -> None: ...

    def storage_failed(self, error: Exception) -> None: ...


@dataclass(frozen=True)
class _Pending:
    owner: MessageOwner
    message: UpstreamMessage
    received_at_ms: int


class MessageSink:
    """Queues messages from every connection and writes them in ``BatchWriteItem`` requests.

    One flush at a time, so a connection's stored position only ever moves over a contiguous
    run of its messages: a checkpoint can never jump a gap. Every write happens before the
    holder's deadline; past it nothing is written (a paused worker writes nothing).
    """

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        worker_id: str,
        session: SessionKeeper,
        flush_every: float,
        ttl_seconds: int | None = None,
        parallel_requests: int = 8,
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self._worker_id = worker_id
        self._session = session
        self._flush_every = flush_every
        self._ttl_seconds = ttl_seconds
        self._parallel = asyncio.Semaphore(parallel_requests)
        self._queue: list[_Pending] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.stored_total = 0

    def add(self, owner: MessageOwner, message: UpstreamMessage) -> None:
        """Queue a message; it is written within ``flush_every`` (sooner when 25 are queued)."""
        self._queue.append(_Pending(owner, message, self._session.clock.wall_ms()))
        if len(self._queue) >= MAX_BATCH_WRITE_ITEMS:
            self._wake.set()

    async def run(self) -> None:
        """The flusher loop; cancel it to stop."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_every)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write everything queued so far; returns once it is stored (or has failed)."""
        async with self._lock:
            batch, self._queue = self._queue, []
            current = self._session.version
            stale = {id(p.owner): p.owner for p in batch if p.owner.session_version != current}
            if stale:  # held under a session that is over: write nothing of theirs
                batch = [p for p in batch if id(p.owner) not in stale]
                for owner in stale.values():
                    owner.storage_failed(SessionLost(f"{owner.pk}: its session is over"))
            if not batch:
                return
            try:
                await asyncio.gather(
                    *(
                        self._write(batch[start : start + MAX_BATCH_WRITE_ITEMS])
                        for start in range(0, len(batch), MAX_BATCH_WRITE_ITEMS)
                    )
                )
            except Exception as exc:
                for owner in {id(p.owner): p.owner for p in batch}.values():
                    owner.storage_failed(exc)
                return
            self.stored_total += len(batch)
            latest: dict[int, tuple[MessageOwner, int, int]] = {}
            for pending in batch:
                owner, count, _ = latest.get(id(pending.owner), (pending.owner, 0, 0))
                latest[id(pending.owner)] = (owner, count + 1, pending.message.seq)
            for owner, count, seq in latest.values():
                owner.stored(count, seq)

    async def first_stored_seq(self, pk: str) -> int | None:
        """The lowest seq stored for ``pk``, or ``None``: one query, oldest first, limit 1.

        Only the checkpoint says up to where the messages are stored *without a gap* (a batch
        write can land partly before a crash), so a new owner resumes from the checkpoint. Before
        the first checkpoint that is the start of what its predecessor stored.
        """
        response = await retry_until(
            lambda: self._dynamodb.call(
                "query",
                TableName=self._table,
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": model.PK, "#seq": model.SEQ},
                ExpressionAttributeValues={":pk": to_attr(pk)},
                Limit=1,
                ConsistentRead=True,
                ProjectionExpression="#pk, #seq",
            ),
            deadline=self._session.deadline,
            clock=self._session.clock,
            what=f"first stored seq of {pk}",
        )
        items = response.get("Items", [])
        return int(items[0][model.SEQ]["N"]) if items else None

    def _item(self, pending: _Pending) -> dict[str, Any]:
        data = pending.message.data
        item: dict[str, Any] = {
            model.PK: pending.owner.pk,
            model.SEQ: pending.message.seq,
            model.MESSAGE_DATA: data if isinstance(data, str) else json.dumps(data),
            model.MESSAGE_RECEIVED_AT_MS: pending.received_at_ms,
            model.MESSAGE_WORKER: self._worker_id,
        }
        if self._ttl_seconds:
            item[model.MESSAGE_EXPIRES_AT] = pending.received_at_ms // 1000 + self._ttl_seconds
        return item

    async def _write(self, chunk: list[_Pending]) -> None:
        requests = [{"PutRequest": {"Item": to_item(self._item(p))}} for p in chunk]
        attempt = 0
        async with self._parallel:
            while requests:
                self._session.require_live()  # never write past the holder's deadline...
                response = await retry_until(
                    lambda requests=requests: self._dynamodb.call(
                        "batch_write_item",
                        RequestItems={self._table: requests},
                        guard=self._session.require_live,  # ...checked again at the send
                    ),
                    deadline=self._session.deadline,
                    clock=self._session.clock,
                    what="store messages",
                )
                requests = response.get("UnprocessedItems", {}).get(self._table, [])
                if requests:
                    delay = full_jitter(attempt, BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
                    if self._session.seconds_left() <= delay:
                        raise StoreUnavailable("store messages: unprocessed until the deadline")
                    await asyncio.sleep(delay)
                    attempt += 1

"""SQS notifications ``{"pk": ...}`` that tell the fleet a connection is claimable right now.

Notifications issued in the same moment (a shutdown releases every connection at once) go out
together in ``SendMessageBatch`` requests of ten.
"""

from __future__ import annotations

import asyncio

from .. import model
from ..aws import AsyncClient

MAX_BATCH = 10  # SQS's limit per SendMessageBatch


class Notifier:
    """Coalesces notifications issued in the same event-loop tick into batched sends."""

    def __init__(self, *, sqs: AsyncClient, queue_url: str):
        self._sqs = sqs
        self._queue_url = queue_url
        self._queued: list[tuple[str, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def notify(self, pk: str) -> None:
        """Send the notification for ``pk``; returns once SQS accepted it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((pk, future))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send_queued())
        await future

    async def _send_queued(self) -> None:
        await asyncio.sleep(0)  # let the other releases of this tick join the batch
        while self._queued:
            queued, self._queued = self._queued, []
            await asyncio.gather(
                *(
                    self._send(queued[start : start + MAX_BATCH])
                    for start in range(0, len(queued), MAX_BATCH)
                )
            )

    async def _send(self, chunk: list[tuple[str, asyncio.Future[None]]]) -> None:
        try:
            response = await self._sqs.call(
                "send_message_batch",
                QueueUrl=self._queue_url,
                Entries=[
                    {"Id": str(n), "MessageBody": model.notification_body(pk)}
                    for n, (pk, _) in enumerate(chunk)
                ],
            )
            failed = {entry["Id"] for entry in response.get("Failed", [])}
        except Exception as exc:
            for _, future in chunk:
                if not future.done():
                    future.set_exception(exc)
            return
        for n, (pk, future) in enumerate(chunk):
            if future.done():
                continue
            if str(n) in failed:
                future.set_exception(RuntimeError(f"{pk}: SQS refused the notification"))
            else:
                future.set_result(None)

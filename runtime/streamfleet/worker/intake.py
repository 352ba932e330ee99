"""The intake queue: how a START, a handoff or a dead task's streams reach a worker in well
under a lease, where reconcile alone would take an interval.

A notification only says where to look: the row, not the message, is the truth. So a message
dealt with is deleted whatever the claim's outcome, one this worker could not try goes straight
back for a peer (visibility 0), and a lost one costs a reconcile interval, never a stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .. import model
from ..aws import AsyncClient
from ..lease import Claimable, SessionKeeper
from ..waiting import wait_at_most
from .config import WorkerConfig
from .holdings import Holdings
from .pacing import jittered
from .taker import LeaseTaker

SQS_VISIBILITY_SECONDS = 30
ERROR_PAUSE_SECONDS = 0.5


@dataclass(eq=False)
class Intake:
    """SQS long polls of up to 10 while there is room; each batch claimed concurrently."""

    config: WorkerConfig
    sqs: AsyncClient
    session: SessionKeeper
    taker: LeaseTaker
    holdings: Holdings
    log: Callable[..., None]

    async def run(self) -> None:
        config = self.config
        holdings = self.holdings
        while not holdings.stopping.is_set():
            free = holdings.free_slots()
            if free <= 0:
                holdings.capacity_freed.clear()
                await wait_at_most(holdings.capacity_freed.wait(), config.sqs_wait_seconds)
                continue
            if self.session.deadline_passed():
                await asyncio.sleep(config.timing.heartbeat_seconds / 2)
                continue
            try:
                response = await self.sqs.call(
                    "receive_message",
                    QueueUrl=config.queue_url,
                    MaxNumberOfMessages=min(10, free),
                    WaitTimeSeconds=config.sqs_wait_seconds,
                    VisibilityTimeout=SQS_VISIBILITY_SECONDS,
                )
            except Exception as exc:
                self.log("intake_failed", error=str(exc))
                await asyncio.sleep(jittered(ERROR_PAUSE_SECONDS))
                continue
            messages = response.get("Messages", [])
            if messages:
                await self._take_in(messages)

    async def _take_in(self, messages: list[dict]) -> None:
        """Claim what the messages announce. Delete each message that was dealt with (claimed,
        or not claimable: the row, not the message, is the truth, and reconcile finds anything
        a lost notification would have announced); hand the others straight back (visibility
        0) so that a peer claims them now rather than after the visibility timeout."""
        by_pk: dict[str, list[dict]] = {}
        handled: list[dict] = []
        orphans: set[str] = set()
        for message in messages:
            try:
                pk = model.parse_notification(message["Body"])
            except ValueError as exc:
                self.log("intake_bad_message", error=str(exc))
                handled.append(message)
                continue
            by_pk.setdefault(pk, []).append(message)
            if model.is_orphan_notification(message["Body"]):
                orphans.add(pk)
        # Orphans of a dead task arrive together: take them only up to this worker's fair share
        # and leave the rest to peers (visible again a second later, so no worker spins on them).
        quota = self.taker.orphan_quota(len(orphans)) if orphans else 0
        over = set(sorted(orphans)[quota:]) if orphans else set()
        wanted = [pk for pk in by_pk if pk not in over]
        outcomes = await asyncio.gather(
            *(self.taker.claim(Claimable(pk), "intake") for pk in wanted)
        )
        returned: list[dict] = []
        stopping = self.holdings.stopping.is_set()
        for pk, outcome in zip(wanted, outcomes, strict=True):
            # Not attempted (stopping, full or busy here): back to the queue. A stopping worker's
            # last long poll may bring its own handoff notifications while those connections
            # are still ending (still held): they are a peer's to claim.
            if outcome is None and (stopping or pk not in self.holdings.connections):
                returned.extend(by_pk[pk])
            else:  # claimed, not claimable, or a duplicate of what this running worker holds
                handled.extend(by_pk[pk])
        await self._sqs_batch("delete_message_batch", handled)
        await self._sqs_batch("change_message_visibility_batch", returned, VisibilityTimeout=0)
        left = [m for pk in over for m in by_pk[pk]]
        await self._sqs_batch("change_message_visibility_batch", left, VisibilityTimeout=1)

    async def _sqs_batch(self, operation: str, messages: list[dict], **entry: int) -> None:
        for start in range(0, len(messages), 10):
            part = messages[start : start + 10]
            try:
                await self.sqs.call(
                    operation,
                    QueueUrl=self.config.queue_url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], **entry}
                        for n, m in enumerate(part)
                    ],
                )
            except Exception as exc:
                self.log("intake_batch_failed", operation=operation, error=str(exc))

"""START and STOP as the fleet's clients issue them: the conditional write, then, if the
connection became claimable, the SQS notification that brings a worker at once.

The event router, the operator CLI and the local harness all go through here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from . import model
from .aws import AsyncClient
from .desired_state import DesiredStateWriter, Result
from .lease.dynamo import is_transient
from .logs import log_event

logger = logging.getLogger(__name__)

NOTIFY_ATTEMPTS = 3
NOTIFY_BACKOFF_SECONDS = 0.05


@dataclass(frozen=True)
class ControlPlane:
    """The operations behind the REST API, usable directly (CLI, local mode, tests)."""

    writer: DesiredStateWriter
    sqs: AsyncClient
    queue_url: str

    @classmethod
    def create(
        cls, *, dynamodb: AsyncClient, sqs: AsyncClient, table_name: str, queue_url: str
    ) -> ControlPlane:
        return cls(DesiredStateWriter(dynamodb=dynamodb, table_name=table_name), sqs, queue_url)

    async def start(
        self, connection_id: str, ws_url: str, readers: tuple[str, ...] | None = None
    ) -> tuple[Result, bool]:
        """Ask for the connection to run. Returns the result and whether the fleet was told.

        A notification that keeps failing is not an error: the row is the truth, and the
        workers' orphan discovery finds it, only later than a notification would.
        """
        result = await self.writer.start(connection_id, ws_url, readers)
        notified = result.notify and await self._notify(model.connection_pk(connection_id))
        return result, notified

    async def stop(self, connection_id: str) -> Result:
        """Ask for the connection to stop; its owner finds out with its next stopped query."""
        return await self.writer.stop(connection_id)

    async def _notify(self, pk: str) -> bool:
        for attempt in range(NOTIFY_ATTEMPTS):
            try:
                await self.sqs.call(
                    "send_message", QueueUrl=self.queue_url, MessageBody=model.notification_body(pk)
                )
                return True
            except Exception as exc:
                if not is_transient(exc) or attempt == NOTIFY_ATTEMPTS - 1:
                    log_event(
                        logger, logging.WARNING, "notify_failed", pk=pk, error=type(exc).__name__
                    )
                    return False
                await asyncio.sleep(NOTIFY_BACKOFF_SECONDS * 2**attempt)
        return False

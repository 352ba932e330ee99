"""START and STOP as the fleet's clients issue them: the conditional write, then, if the
connection became claimable, the SQS notification that brings a worker at once."""

from __future__ import annotations

from dataclasses import dataclass

from . import model
from .aws import AsyncClient
from .desired_state import DesiredStateWriter, Result


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

    async def start(self, connection_id: str, ws_url: str) -> Result:
        """Ask for the connection to run; notify the fleet if it is claimable now."""
        result = await self.writer.start(connection_id, ws_url)
        if result.notify:
            await self.sqs.call(
                "send_message",
                QueueUrl=self.queue_url,
                MessageBody=model.notification_body(model.connection_pk(connection_id)),
            )
        return result

    async def stop(self, connection_id: str) -> Result:
        """Ask for the connection to stop; its owner finds out with its next stopped query."""
        return await self.writer.stop(connection_id)

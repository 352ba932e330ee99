"""The worker's AWS clients, apart from what uses them: renewals get a client of their own, so
that a backlog of message writes can never queue a renewal past the holder's deadline."""

from __future__ import annotations

import math
from dataclasses import dataclass

import boto3

from ..aws import AsyncClient, ClientSettings
from .config import WorkerConfig


@dataclass(frozen=True)
class WorkerClients:
    """The worker's AWS clients, each with its own bounded pool."""

    dynamodb: AsyncClient
    renewals: AsyncClient  # session renewals only: never queued behind message writes
    sqs: AsyncClient

    @classmethod
    def create(
        cls, config: WorkerConfig, session: boto3.session.Session | None = None
    ) -> WorkerClients:
        """Clients whose read timeouts let a slow-but-working DynamoDB answer within the
        holder's window: the deadline, not a timeout, is what ends connections."""
        window = config.timing.holder_window_seconds
        session = session or boto3.session.Session()
        return cls(
            dynamodb=AsyncClient(
                "dynamodb",
                settings=ClientSettings(threads=32, read_timeout_seconds=window),
                session=session,
            ),
            renewals=AsyncClient(
                "dynamodb",
                settings=ClientSettings(
                    threads=2 * math.ceil(window / config.timing.heartbeat_seconds),
                    connect_timeout_seconds=min(1.0, config.timing.heartbeat_seconds),
                    read_timeout_seconds=window,
                ),
                session=session,
            ),
            sqs=AsyncClient(
                "sqs",
                settings=ClientSettings(
                    threads=4, read_timeout_seconds=config.sqs_wait_seconds + 5
                ),
                session=session,
            ),
        )

    def request_counts(self) -> dict[str, dict[str, int]]:
        """The requests sent so far by service and operation, as the worker's logs report them."""
        return {
            "dynamodb_requests": dict(self.dynamodb.requests + self.renewals.requests),
            "sqs_requests": dict(self.sqs.requests),
        }

    def close(self) -> None:
        for client in (self.dynamodb, self.renewals, self.sqs):
            client.close()

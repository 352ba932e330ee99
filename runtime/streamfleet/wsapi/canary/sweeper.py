"""Server-driven failover: while the Region reports unhealthy, every client connection it
recorded is closed through the Management API (``DeleteConnection``) and its record deleted."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ... import model
from ...aws import AsyncClient, ClientSettings
from ...lease.dynamo import error_code, names, to_attr
from ...logs import log_event

# The package's logger: the canary's log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)

# DeleteConnection calls in flight at once, and the time a run may spend on them (what is left
# is closed by the next run, a minute later).
DISCONNECT_CONCURRENCY = 8
DEFAULT_DISCONNECT_BUDGET_SECONDS = 20.0
MANAGEMENT_CLIENT_SETTINGS = ClientSettings(threads=DISCONNECT_CONCURRENCY)


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: connections closed, already gone, failed; whether it ran out of time."""

    closed: int = 0
    gone: int = 0
    failed: int = 0
    incomplete: bool = False


class Disconnector(Protocol):
    """Closes every client connection of the region."""

    async def sweep(self) -> SweepResult:
        """Close what is open now."""


class ConnectionSweeper:
    """``DeleteConnection`` for every ``WSCONN#<id>`` record of the regional connections table.

    The connection ids come from the table the ``$connect`` handler writes (API Gateway has no
    "list connections" call). Each closed or already-gone connection's record is deleted, since
    the ``$disconnect`` handler may be throttled as well. At most ``concurrency`` calls are in
    flight; after ``budget_seconds`` no new one starts (the next run goes on).
    """

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        management: AsyncClient,
        table_name: str,
        concurrency: int = DISCONNECT_CONCURRENCY,
        budget_seconds: float = DEFAULT_DISCONNECT_BUDGET_SECONDS,
    ):
        self._dynamodb = dynamodb
        self._management = management
        self._table = table_name
        self._concurrency = concurrency
        self._budget = budget_seconds

    async def connection_ids(self) -> list[str]:
        """Every client connection recorded now (a canary's own probes close themselves)."""
        ids: list[str] = []
        params: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": (
                "begins_with(#pk, :prefix) AND NOT begins_with(#user_id, :canary)"
            ),
            "ProjectionExpression": "#pk",
            "ExpressionAttributeNames": names(model.PK, model.WS_USER_ID),
            "ExpressionAttributeValues": {
                ":prefix": to_attr(model.WS_CONNECTION_PREFIX),
                ":canary": to_attr(model.CANARY_PRINCIPAL_PREFIX),
            },
        }
        while True:
            page = await self._dynamodb.call("scan", **params)
            for item in page.get("Items", []):
                pk = item[model.PK]["S"]
                ids.append(pk[len(model.WS_CONNECTION_PREFIX) :])
            if "LastEvaluatedKey" not in page:
                return ids
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def sweep(self) -> SweepResult:
        deadline = time.monotonic() + self._budget
        ids = await self.connection_ids()
        counts = {"closed": 0, "gone": 0, "failed": 0}
        incomplete = False
        semaphore = asyncio.Semaphore(self._concurrency)

        async def close(connection_id: str) -> None:
            async with semaphore:
                if time.monotonic() > deadline:
                    nonlocal incomplete
                    incomplete = True
                    return
                try:
                    await self._management.call("delete_connection", ConnectionId=connection_id)
                    outcome = "closed"
                except Exception as exc:
                    if error_code(exc) != "GoneException":
                        counts["failed"] += 1
                        log_event(
                            logger,
                            logging.WARNING,
                            "canary_disconnect",
                            decision="error",
                            connectionId=connection_id,
                            detail=f"{type(exc).__name__}: {exc}",
                        )
                        return
                    outcome = "gone"
                counts[outcome] += 1
                try:
                    await self._dynamodb.call(
                        "delete_item",
                        TableName=self._table,
                        Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
                    )
                except Exception as exc:  # the next sweep finds it gone and tries again
                    log_event(
                        logger,
                        logging.WARNING,
                        "canary_disconnect",
                        decision="error",
                        reason="delete_record",
                        connectionId=connection_id,
                        detail=f"{type(exc).__name__}: {exc}",
                    )

        await asyncio.gather(*(close(connection_id) for connection_id in ids))
        return SweepResult(counts["closed"], counts["gone"], counts["failed"], incomplete)

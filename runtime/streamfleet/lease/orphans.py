"""Orphan discovery at O(workers + orphans): never a scan of all connections.

Two sources, both sparse indexes:

* ``awaiting-owner``: STARTED connections nobody owns (new, released, or handed off);
* ``by-owner``, asked only for sessions that have ended or expired: their connections.

Sessions come from the ``sessions`` index (keys only) and consistent batched reads, a handful of
items. Expired sessions are fenced before their connections are offered; ended sessions that
own nothing any more are marked cleared (never asked again) and left to the table's TTL.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import model
from ..aws import AsyncClient
from .connections import Claimable
from .dynamo import conditional_write, from_item, names, query_all, retry_until, to_attr
from .errors import StoreUnavailable
from .sessions import SessionDirectory, SessionInfo

# How long an ended session is still asked for its connections after it expired, beyond the
# lease and the skew: a secondary index normally lags by well under a second, and an acquisition
# made just before the session died must have reached the by-owner index before an empty answer
# can mean "owns nothing". Even then the session is only marked cleared, never deleted.
INDEX_LAG_ALLOWANCE_MS = 60_000
# Unowned rows are read this many keys a page, at most this many pages a reconcile: enough to see
# past the held-off rows a worker knows, bounded whatever their number.
UNOWNED_PAGE = 100
UNOWNED_PAGES = 5


@dataclass
class Orphans:
    """What one discovery found: rows of dead sessions (each with the expiry of its session,
    i.e. since when it has been orphaned) and unowned rows."""

    of_dead_sessions: list[tuple[Claimable, int]] = field(default_factory=list)
    unowned: list[Claimable] = field(default_factory=list)

    def candidates(self) -> list[Claimable]:
        return [c for c, _ in self.of_dead_sessions] + self.unowned


class OrphanFinder:
    """Finds connections that should be running and have no live owner."""

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        directory: SessionDirectory,
        known_held: Callable[[str], bool] = lambda pk: False,
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self.directory = directory
        # Unowned rows this worker knows to be held off after a failure: still in the index,
        # they are passed over, or the first few keys would fill every answer for ever.
        self._known_held = known_held

    def _deadline(self) -> float:
        return self.directory.clock.monotonic() + self.directory.timing.lease_seconds

    async def find(self, limit: int, sessions: list[SessionInfo] | None = None) -> list[Claimable]:
        """Up to ``limit`` claimable connections, those of dead sessions first."""
        found = await self.discover(limit, sessions)
        return found.candidates()[:limit]

    async def discover(self, limit: int, sessions: list[SessionInfo] | None = None) -> Orphans:
        """Every STARTED row of every dead session (in random order, so that workers reconciling
        at the same moment start on different rows) and up to ``limit`` unowned rows.

        ``sessions``: the fleet's sessions if the caller has just listed them (it reuses the
        list for rebalancing); read here otherwise.
        """
        found = Orphans()
        if limit <= 0:
            return found
        for session in sessions if sessions is not None else await self.directory.list():
            if session.cleared or not self.directory.is_expired(session):
                continue
            if not await self.directory.fence(session):
                continue  # it was renewed after all
            rows, settled = await self._owned_by(session)
            if settled and not rows and self._long_gone(session):
                await self.directory.clear(session)
            found.of_dead_sessions.extend((row, session.expires_at_ms) for row in rows)
        random.shuffle(found.of_dead_sessions)
        found.unowned = await self._unowned(limit)
        return found

    def _long_gone(self, session: SessionInfo) -> bool:
        """Expired long enough ago that the by-owner index has caught up with any acquisition
        the session made, so an empty answer means it really owns nothing."""
        timing = self.directory.timing
        grace_ms = timing.lease_ms + timing.max_clock_skew_ms + INDEX_LAG_ALLOWANCE_MS
        return session.expires_at_ms + grace_ms < self.directory.clock.wall_ms()

    async def _owned_by(self, session: SessionInfo) -> tuple[list[Claimable], bool]:
        """The STARTED rows of an ended session, and whether every row was accounted for."""
        items = await query_all(
            self._dynamodb,
            clock=self.directory.clock,
            deadline=self._deadline(),
            what=f"connections of {session.pk}",
            TableName=self._table,
            IndexName=model.OWNER_INDEX.name,
            KeyConditionExpression="#lease_owner = :owner",
            FilterExpression="#lease_session = :version",
            ExpressionAttributeNames=names(model.LEASE_OWNER, model.LEASE_SESSION),
            ExpressionAttributeValues={
                ":owner": to_attr(session.owner),
                ":version": to_attr(session.version),
            },
        )
        started = model.DesiredState.STARTED.value
        claimable = [
            Claimable(item[model.PK], session.owner, session.version)
            for item in items
            if item.get(model.DESIRED_STATE) == started
        ]
        settled = True
        for item in items:
            if item.get(model.DESIRED_STATE) == started:
                continue
            # A STOP that reached a worker which then died leaves a STOPPED row naming a dead
            # owner: clear it (or hand it to a worker that seals its log). If that fails, a START
            # landed meanwhile and the row is STARTED again: take it as an orphan like the rest.
            row = await self._disown(item[model.PK], session)
            if row is not None:
                settled = False
                if row.get(model.DESIRED_STATE) == started and self._owned(row, session):
                    claimable.append(Claimable(row[model.PK], session.owner, session.version))
        return claimable, settled

    @staticmethod
    def _owned(row: dict, session: SessionInfo) -> bool:
        return (
            row.get(model.LEASE_OWNER) == session.owner
            and row.get(model.LEASE_SESSION) == session.version
        )

    async def _disown(self, pk: str, session: SessionInfo) -> dict | None:
        """Remove a dead owner from a STOPPED row. ``None`` once done (or nothing to do); the
        row as it stands now if it changed under us (restarted, or taken)."""
        row = await self._read(pk)
        if row is None or not self._owned(row, session):
            return None  # the index lagged: it has moved on already
        if row.get(model.DESIRED_STATE) != model.DesiredState.STOPPED.value:
            return row
        # A log its owner never sealed may have holes past its checkpoint: leave the row
        # claimable so that a worker seals it; otherwise it is simply closed.
        update = "REMOVE #lease_owner, #lease_session, #stop_requested_for"
        attributes = [model.LEASE_OWNER, model.LEASE_SESSION, model.STOP_REQUESTED_FOR]
        values = {
            ":owner": to_attr(session.owner),
            ":version": to_attr(session.version),
            ":stopped": to_attr(model.DesiredState.STOPPED.value),
        }
        if model.UNSEALED in row:
            update += " SET #awaiting_owner = :awaiting"
            attributes.append(model.AWAITING_OWNER)
            values[":awaiting"] = to_attr(model.awaiting_owner_value(pk))
        if await conditional_write(
            self._dynamodb,
            "update_item",
            clock=self.directory.clock,
            deadline=self._deadline(),
            what=f"disown {pk}",
            TableName=self._table,
            Key={model.PK: to_attr(pk)},
            UpdateExpression=update,
            ConditionExpression=(
                "#lease_owner = :owner AND #lease_session = :version AND #desired_state = :stopped"
            ),
            ExpressionAttributeNames=names(*attributes, model.DESIRED_STATE),
            ExpressionAttributeValues=values,
        ):
            return None
        return await self._read(pk) or {}

    async def _read(self, pk: str) -> dict | None:
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item", TableName=self._table, Key={model.PK: to_attr(pk)}, ConsistentRead=True
            ),
            deadline=self._deadline(),
            clock=self.directory.clock,
            what=f"read {pk}",
        )
        return from_item(response.get("Item"))

    async def _unowned(self, limit: int) -> list[Claimable]:
        """Up to ``limit`` unowned rows, past those known to be held off: every shard queried at
        once (a few pages of each at most: the index lists keys only).

        Taken from a random shard on, so that a fleet asking for a few rows each does not take
        them all from the first shard while the others wait. A shard that could not be read
        leaves the others' rows to claim (it is read again at the next reconcile).
        """
        shards = model.AWAITING_OWNER_READ_VALUES
        first = random.randrange(len(shards))
        deadline = self._deadline()
        results = await asyncio.gather(
            *(
                self._unowned_in(shard, limit, deadline)
                for shard in shards[first:] + shards[:first]
            ),
            return_exceptions=True,
        )
        found = [
            candidate for result in results if isinstance(result, list) for candidate in result
        ]
        failures = [result for result in results if isinstance(result, BaseException)]
        for failure in failures:
            if not isinstance(failure, StoreUnavailable) or not found:
                raise failure
        return found[:limit]

    async def _unowned_in(self, shard: str, limit: int, deadline: float) -> list[Claimable]:
        params: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": model.AWAITING_OWNER_INDEX.name,
            "KeyConditionExpression": "#awaiting_owner = :shard",
            "ExpressionAttributeNames": names(model.AWAITING_OWNER),
            "ExpressionAttributeValues": {":shard": to_attr(shard)},
            "Limit": max(limit, UNOWNED_PAGE),
        }
        found: list[Claimable] = []
        for _ in range(UNOWNED_PAGES):
            response = await retry_until(
                lambda params=dict(params): self._dynamodb.call("query", **params),
                deadline=deadline,
                clock=self.directory.clock,
                what="unowned connections",
            )
            for raw in response.get("Items", []):
                pk = str(from_item(raw)[model.PK])
                if not self._known_held(pk):
                    found.append(Claimable(pk))
            last = response.get("LastEvaluatedKey")
            if len(found) >= limit or not last:
                break
            params["ExclusiveStartKey"] = last
        return found

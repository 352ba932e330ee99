"""Orphan discovery at O(workers + orphans): never a scan of all connections.

Two sources, both sparse indexes:

* ``awaiting-owner``: STARTED connections nobody owns (new, released, or handed off);
* ``by-owner``, asked only for sessions that have ended or expired: their connections.

Sessions come from the ``sessions`` index (keys only) and consistent batched reads, a handful of
items. Expired sessions are fenced before their connections are offered, and ended sessions that
own nothing any more are deleted so the list stays as long as the fleet.
"""

from __future__ import annotations

from .. import model
from ..aws import AsyncClient
from .connections import Claimable
from .dynamo import conditional_write, names, query_all, to_attr
from .sessions import SessionDirectory, SessionInfo


class OrphanFinder:
    """Finds connections that should be running and have no live owner."""

    def __init__(self, *, dynamodb: AsyncClient, table_name: str, directory: SessionDirectory):
        self._dynamodb = dynamodb
        self._table = table_name
        self.directory = directory

    def _deadline(self) -> float:
        return self.directory.clock.monotonic() + self.directory.timing.lease_seconds

    async def find(self, limit: int, sessions: list[SessionInfo] | None = None) -> list[Claimable]:
        """Up to ``limit`` claimable connections, those of dead sessions first.

        ``sessions``: the fleet's sessions if the caller has just listed them (it reuses the
        list for rebalancing); read here otherwise.
        """
        if limit <= 0:
            return []
        found: list[Claimable] = []
        for session in sessions if sessions is not None else await self.directory.list():
            if len(found) >= limit or not self.directory.is_expired(session):
                continue
            if not await self.directory.fence(session):
                continue  # it was renewed after all
            owned = await self._owned_by(session, limit - len(found))
            if not owned and self._long_gone(session):
                await self.directory.forget(session)
            found.extend(owned)
        if len(found) < limit:
            found.extend(await self._unowned(limit - len(found)))
        return found[:limit]

    def _long_gone(self, session: SessionInfo) -> bool:
        """Expired for a whole lease more: the by-owner index has caught up with any
        acquisition the session made, so an empty answer means it really owns nothing."""
        timing = self.directory.timing
        grace_ms = timing.lease_ms + timing.max_clock_skew_ms
        return session.expires_at_ms + grace_ms < self.directory.clock.wall_ms()

    async def _owned_by(self, session: SessionInfo, limit: int) -> list[Claimable]:
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
        started = [
            Claimable(item[model.PK], session.owner, session.version)
            for item in items
            if item.get(model.DESIRED_STATE) == model.DesiredState.STARTED.value
        ]
        stopped = [
            item[model.PK] for item in items if item[model.PK] not in {c.pk for c in started}
        ]
        # A STOP that reached a worker which then died leaves a STOPPED row naming a dead owner;
        # clear it so the session can be forgotten and operators see the truth.
        for pk in stopped:
            await self._disown(pk, session)
        return started[:limit]

    async def _disown(self, pk: str, session: SessionInfo) -> None:
        # A failed condition means it was restarted or taken meanwhile: nothing to clear.
        await conditional_write(
            self._dynamodb,
            "update_item",
            clock=self.directory.clock,
            deadline=self._deadline(),
            what=f"disown {pk}",
            TableName=self._table,
            Key={model.PK: to_attr(pk)},
            UpdateExpression="REMOVE #lease_owner, #lease_session, #stop_requested_for",
            ConditionExpression=(
                "#lease_owner = :owner AND #lease_session = :version AND #desired_state = :stopped"
            ),
            ExpressionAttributeNames=names(
                model.LEASE_OWNER,
                model.LEASE_SESSION,
                model.STOP_REQUESTED_FOR,
                model.DESIRED_STATE,
            ),
            ExpressionAttributeValues={
                ":owner": to_attr(session.owner),
                ":version": to_attr(session.version),
                ":stopped": to_attr(model.DesiredState.STOPPED.value),
            },
        )

    async def _unowned(self, limit: int) -> list[Claimable]:
        items = await query_all(
            self._dynamodb,
            clock=self.directory.clock,
            deadline=self._deadline(),
            what="unowned connections",
            TableName=self._table,
            IndexName=model.AWAITING_OWNER_INDEX.name,
            KeyConditionExpression="#awaiting_owner = :started",
            ExpressionAttributeNames=names(model.AWAITING_OWNER),
            ExpressionAttributeValues={":started": to_attr(model.AWAITING_OWNER_VALUE)},
            Limit=limit,
        )
        return [Claimable(item[model.PK]) for item in items][:limit]

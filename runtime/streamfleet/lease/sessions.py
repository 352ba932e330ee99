"""Sessions: one item per worker session, renewed every heartbeat; the fleet's view of them.

A worker renews *its session*, not each connection, so lease upkeep costs O(workers) writes.
Every connection it owns names the session it was acquired under; when the session ends (closed,
or fenced by a taker after it expired) all of them become claimable together.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from .. import model
from ..aws import AsyncClient
from ..clock import SYSTEM_CLOCK, Clock
from .dynamo import (
    batch_get,
    conditional_write,
    from_item,
    hedged,
    is_condition_failure,
    names,
    old_item_of,
    query_all,
    retry_until,
    to_attr,
)
from .errors import SessionLost, StoreUnavailable
from .timing import LeaseTiming


@dataclass(frozen=True)
class SessionInfo:
    """A session item as read from the table."""

    owner: str
    version: int
    state: model.SessionState
    expires_at_ms: int
    region: str = ""
    capacity: int = 0
    load: int = 0
    cleared: bool = False

    @property
    def pk(self) -> str:
        return model.session_pk(self.owner, self.version)

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> SessionInfo:
        return cls(
            owner=item[model.SESSION_OWNER],
            version=int(item[model.SESSION_VERSION]),
            state=model.SessionState(item[model.SESSION_STATE]),
            expires_at_ms=int(item[model.EXPIRES_AT_MS]),
            region=item.get(model.SESSION_REGION, ""),
            capacity=int(item.get(model.SESSION_CAPACITY, 0)),
            load=int(item.get(model.SESSION_LOAD, 0)),
            cleared=bool(item.get(model.SESSION_CLEARED, False)),
        )


def delete_after(clock: Clock) -> int:
    """The TTL value of a session that ends now: long past any index lag or reconcile."""
    return clock.wall_ms() // 1000 + model.ENDED_SESSION_RETENTION_SECONDS


class SessionKeeper:
    """This process's session: opens, renews and closes it, and knows the holder's deadline.

    The deadline is on the monotonic clock: ``sent_at_of_last_successful_renew + lease - skew -
    margin``. Past it the worker must hold no connection; a renewal attempted past it opens a new
    session version instead, because the old one may already have been taken over.
    """

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        worker_id: str,
        timing: LeaseTiming,
        clock: Clock = SYSTEM_CLOCK,
        group: str = model.DEFAULT_SESSION_GROUP,
        region: str = "",
        capacity: int = 0,
        task_arn: str = "",
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self.worker_id = worker_id
        self.timing = timing
        self.clock = clock
        self.group = group
        self.region = region
        self.capacity = capacity
        self.task_arn = task_arn  # the ECS task running this worker, "" outside ECS
        self.version: int | None = None
        self.deadline = float("-inf")
        self.drain_requested = False

    # -- the holder's view -------------------------------------------------------------------

    @property
    def pk(self) -> str:
        if self.version is None:
            raise SessionLost("no session is open")
        return model.session_pk(self.worker_id, self.version)

    def deadline_passed(self) -> bool:
        return self.clock.monotonic() >= self.deadline

    def seconds_left(self) -> float:
        """Seconds until the holder's deadline (negative once it has passed)."""
        return self.deadline - self.clock.monotonic()

    def require_live(self, version: int | None = None) -> int:
        """The session version, or :class:`SessionLost` if the deadline has passed (or, given a
        ``version``, if that session is no longer the current one)."""
        if self.version is None or self.deadline_passed():
            raise SessionLost(f"{self.worker_id}: session deadline passed")
        if version is not None and version != self.version:
            raise SessionLost(f"{self.worker_id}: session {version} is over")
        return self.version

    # -- operations ----------------------------------------------------------------------------

    async def open(self, *, load: int = 0) -> int:
        """Start a new session (a new ``session_version``) and return its version."""
        version = max(time.time_ns() // 1000, (self.version or 0) + 1)
        first_sent: float | None = None

        async def put() -> dict[str, Any]:
            nonlocal first_sent
            if first_sent is None:
                first_sent = self.clock.monotonic()
            wall = self.clock.wall_ms()
            item = {
                model.PK: model.session_pk(self.worker_id, version),
                model.SESSION_OWNER: self.worker_id,
                model.SESSION_VERSION: version,
                model.SESSION_GROUP: self.group,
                model.SESSION_STATE: model.SessionState.LIVE.value,
                model.EXPIRES_AT_MS: wall + self.timing.lease_ms,
                model.STARTED_AT_MS: wall,
                model.SESSION_CAPACITY: self.capacity,
                model.SESSION_LOAD: load,
            }
            if self.region:
                item[model.SESSION_REGION] = self.region
            if self.task_arn:
                item[model.SESSION_TASK_ARN] = self.task_arn
            return await self._dynamodb.call(
                "put_item",
                TableName=self._table,
                Item={name: to_attr(value) for name, value in item.items()},
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames=names(model.PK),
            )

        try:
            await retry_until(
                put,
                deadline=self.clock.monotonic() + self.timing.lease_seconds,
                clock=self.clock,
                what=f"open session of {self.worker_id}",
            )
        except Exception as exc:
            # A retry whose first attempt was applied finds the item there: ours, not a clash.
            if not is_condition_failure(exc) or not await self._exists(version):
                raise
        self.version = version
        # Whichever attempt was applied, none was sent before the first: counting from it never
        # trusts the session longer than the expiry the table holds.
        assert first_sent is not None
        self.deadline = self.timing.holder_deadline(first_sent)
        return version

    async def _exists(self, version: int) -> bool:
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item",
                TableName=self._table,
                Key={model.PK: to_attr(model.session_pk(self.worker_id, version))},
                ConsistentRead=True,
            ),
            deadline=self.clock.monotonic() + self.timing.lease_seconds,
            clock=self.clock,
            what=f"read session {self.worker_id}#{version}",
        )
        return "Item" in response

    async def renew(self, *, load: int = 0) -> bool:
        """Extend the session. ``True``: same session renewed; ``False``: a new one was opened.

        Raises :class:`SessionLost` if the session was fenced by a taker (the caller must drop
        every connection it holds), :class:`StoreUnavailable` if DynamoDB did not answer before
        the deadline.

        A renewal never lowers ``expires_at_ms`` (its condition says so), so an attempt that is
        delivered late, after a later renewal, changes nothing. Several renewals may be
        outstanding at once (the heartbeat sends one every heartbeat whether or not the one before
        has answered), and they are each other's hedge: each makes one attempt at a time (another
        only after a failure), moves the deadline to a window after its first attempt, and keeps
        trying until then. An answer that comes after the deadline has passed counts as a
        failure: the session is not revived.
        """
        if self.version is None:
            await self.open(load=load)
            return False
        if self.deadline_passed():
            await self._end_quietly(self.version)
            await self.open(load=load)
            return False
        version, pk = self.version, self.pk
        first_sent = self.clock.monotonic()

        async def update() -> dict[str, Any]:
            if self.version != version or self.deadline_passed():
                # Lapsed or replaced while this renewal retried: another attempt could only push
                # the old row's expiry out and keep takers from streams already dropped.
                raise StoreUnavailable(f"renew {pk}: the session lapsed before this attempt")
            expires = self.clock.wall_ms() + self.timing.lease_ms
            try:
                response = await self._dynamodb.call(
                    "update_item",
                    TableName=self._table,
                    Key={model.PK: to_attr(pk)},
                    UpdateExpression="SET #expires_at_ms = :expires, #load = :load",
                    ConditionExpression="#session_state = :live AND #expires_at_ms < :expires",
                    ExpressionAttributeNames=names(
                        model.EXPIRES_AT_MS, model.SESSION_LOAD, model.SESSION_STATE
                    ),
                    ExpressionAttributeValues={
                        ":expires": to_attr(expires),
                        ":load": to_attr(load),
                        ":live": to_attr(model.SessionState.LIVE.value),
                    },
                    # The item comes back with the renewal, so an operator's drain request
                    # reaches the holder without a read of its own.
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return from_item(response["Attributes"]) or {}
            except ClientError as exc:
                if not is_condition_failure(exc):
                    raise
                item = old_item_of(exc) or await self._read(pk)
            if (
                item is not None
                and item.get(model.SESSION_STATE) == model.SessionState.LIVE.value
                and int(item.get(model.EXPIRES_AT_MS, 0)) >= expires
            ):
                return item  # another attempt of this renewal landed first, with a later expiry
            raise SessionLost(f"{pk}: session was ended or fenced by another worker")

        try:
            item = await hedged(
                update,
                # Not the session's deadline as it stands now: a renewal sent before the answer
                # to the one before it keeps trying as long as its own answer could still
                # move the deadline.
                deadline=self.timing.holder_deadline(first_sent),
                clock=self.clock,
                what=f"renew {pk}",
                # The next renewal, a heartbeat later, is the hedge: a sibling of each as well
                # would multiply the writes to a slow store (measured: a store slowed by a
                # heartbeat then slowed further, and sessions lapsed).
                hedge_after=self.timing.holder_window_seconds,
            )
        except SessionLost:
            if self.version == version:
                self.version = None
                self.deadline = float("-inf")
            raise
        if self.version == version:
            if self.deadline_passed():
                # Its connections have ended by now: the session is not revived, the heartbeat
                # opens a new one (a renewal answered late is a renewal that failed).
                raise StoreUnavailable(f"renew {pk}: answered after the holder's deadline")
            # Counted from the first attempt: whichever was applied, the table's expiry is at
            # least the one that attempt wrote.
            self.deadline = max(self.deadline, self.timing.holder_deadline(first_sent))
            self.drain_requested = model.DRAIN_REQUESTED in item
        return True

    async def _read(self, pk: str) -> dict[str, Any] | None:
        response = await self._dynamodb.call(
            "get_item", TableName=self._table, Key={model.PK: to_attr(pk)}, ConsistentRead=True
        )
        return from_item(response.get("Item"))

    async def close(self) -> None:
        """End the session: its remaining connections become claimable at once."""
        if self.version is not None:
            version, self.version = self.version, None
            self.deadline = float("-inf")
            await self._end_quietly(version)

    async def _end_quietly(self, version: int) -> None:
        pk = model.session_pk(self.worker_id, version)
        # Ending it early only speeds recovery up: unanswered, it expires on its own.
        with contextlib.suppress(StoreUnavailable):
            await conditional_write(
                self._dynamodb,
                "update_item",
                clock=self.clock,
                deadline=self.clock.monotonic() + self.timing.heartbeat_seconds,
                what=f"end {pk}",
                TableName=self._table,
                Key={model.PK: to_attr(pk)},
                UpdateExpression="SET #session_state = :ended, #delete_after = :delete_after",
                ConditionExpression="#session_state = :live",
                ExpressionAttributeNames=names(model.SESSION_STATE, model.DELETE_AFTER),
                ExpressionAttributeValues={
                    ":ended": to_attr(model.SessionState.ENDED.value),
                    ":live": to_attr(model.SessionState.LIVE.value),
                    ":delete_after": to_attr(delete_after(self.clock)),
                },
            )


class SessionDirectory:
    """The fleet's sessions as other workers see them: list, read, fence, forget."""

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        timing: LeaseTiming,
        clock: Clock = SYSTEM_CLOCK,
        group: str = model.DEFAULT_SESSION_GROUP,
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self.timing = timing
        self.clock = clock
        self.group = group

    def _deadline(self) -> float:
        return self.clock.monotonic() + self.timing.lease_seconds

    def is_expired(self, session: SessionInfo) -> bool:
        """Taker's rule: gone when expired by more than the clock skew, or ended."""
        return session.state is model.SessionState.ENDED or self.timing.is_expired_for_taker(
            session.expires_at_ms, self.clock.wall_ms()
        )

    async def list(self) -> list[SessionInfo]:
        """Every session of the group: one index query, then consistent batched reads."""
        deadline = self._deadline()
        keys = await query_all(
            self._dynamodb,
            clock=self.clock,
            deadline=deadline,
            what="list sessions",
            TableName=self._table,
            IndexName=model.SESSION_INDEX.name,
            KeyConditionExpression="#session_group = :group",
            ExpressionAttributeNames=names(model.SESSION_GROUP),
            ExpressionAttributeValues={":group": to_attr(self.group)},
        )
        items = await batch_get(
            self._dynamodb,
            table_name=self._table,
            keys=[{model.PK: to_attr(key[model.PK])} for key in keys],
            consistent=True,
            clock=self.clock,
            deadline=deadline,
            what="read sessions",
        )
        return sorted(
            (SessionInfo.from_item(item) for item in items), key=lambda s: (s.owner, s.version)
        )

    async def read(self, owner: str, version: int) -> SessionInfo | None:
        """One session, read consistently; ``None`` if it no longer exists."""
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item",
                TableName=self._table,
                Key={model.PK: to_attr(model.session_pk(owner, version))},
                ConsistentRead=True,
            ),
            deadline=self._deadline(),
            clock=self.clock,
            what=f"read session {owner}#{version}",
        )
        item = from_item(response.get("Item"))
        return SessionInfo.from_item(item) if item else None

    async def fence(self, session: SessionInfo) -> bool:
        """End an expired session so its holder can never renew it again.

        Conditional on ``expires_at_ms`` being what the taker saw: a renewal that lands first
        makes the fence fail (the session is alive), one that lands later fails on the state.
        Either way there is one linearisation point, so a slow renewal in flight cannot leave
        both the holder and the taker believing they own a connection. ``True`` if the session
        is ended now.
        """
        if session.state is model.SessionState.ENDED:
            return True
        if await conditional_write(
            self._dynamodb,
            "update_item",
            clock=self.clock,
            deadline=self._deadline(),
            what=f"fence {session.pk}",
            TableName=self._table,
            Key={model.PK: to_attr(session.pk)},
            UpdateExpression="SET #session_state = :ended, #delete_after = :delete_after",
            ConditionExpression="#session_state = :live AND #expires_at_ms = :seen",
            ExpressionAttributeNames=names(
                model.SESSION_STATE, model.EXPIRES_AT_MS, model.DELETE_AFTER
            ),
            ExpressionAttributeValues={
                ":ended": to_attr(model.SessionState.ENDED.value),
                ":live": to_attr(model.SessionState.LIVE.value),
                ":seen": to_attr(session.expires_at_ms),
                ":delete_after": to_attr(delete_after(self.clock)),
            },
        ):
            return True
        current = await self.read(session.owner, session.version)
        return current is None or current.state is model.SessionState.ENDED

    async def request_drain(self, owner: str) -> list[SessionInfo]:
        """Ask worker ``owner`` to hand all its connections to the fleet and take no more.

        It sees the request in its next renewal (within a heartbeat). Returns the sessions asked.
        """
        asked = []
        for session in await self.list():
            if session.owner != owner or session.state is not model.SessionState.LIVE:
                continue
            if await conditional_write(
                self._dynamodb,
                "update_item",
                clock=self.clock,
                deadline=self._deadline(),
                what=f"drain {session.pk}",
                TableName=self._table,
                Key={model.PK: to_attr(session.pk)},
                UpdateExpression="SET #drain_requested = :yes",
                ConditionExpression="#session_state = :live",  # not if it ended meanwhile
                ExpressionAttributeNames=names(model.DRAIN_REQUESTED, model.SESSION_STATE),
                ExpressionAttributeValues={
                    ":yes": to_attr(True),
                    ":live": to_attr(model.SessionState.LIVE.value),
                },
            ):
                asked.append(session)
        return asked

    async def clear(self, session: SessionInfo) -> None:
        """Mark an ended session whose connections have all been handled: reconcile skips it
        from now on. The item stays until its TTL (``delete_after``) removes it: deleting it on
        the strength of an index query that may lag could orphan a row for ever."""
        await conditional_write(
            self._dynamodb,
            "update_item",
            clock=self.clock,
            deadline=self._deadline(),
            what=f"clear {session.pk}",
            TableName=self._table,
            Key={model.PK: to_attr(session.pk)},
            UpdateExpression="SET #cleared = :yes",
            ConditionExpression="#session_state = :ended",
            ExpressionAttributeNames=names(model.SESSION_CLEARED, model.SESSION_STATE),
            ExpressionAttributeValues={
                ":yes": to_attr(True),
                ":ended": to_attr(model.SessionState.ENDED.value),
            },
        )

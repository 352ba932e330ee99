"""Connection leases: acquire, take over, checkpoint, release, and "which of mine were stopped?".

Every write a holder makes to a connection is fenced on ``lease_owner`` and ``lease_version``
(incremented by every acquisition), so a holder that was paused past its deadline can never
write again once someone else has acquired the connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .. import model
from ..aws import AsyncClient
from .dynamo import (
    batch_get,
    from_item,
    is_condition_failure,
    names,
    old_item_of,
    query_all,
    retry_until,
    to_attr,
)
from .errors import LeaseLost, SessionLost, StoreUnavailable
from .sessions import SessionDirectory, SessionKeeper

STARTED = model.DesiredState.STARTED.value
STOPPED = model.DesiredState.STOPPED.value
# A claim that races with another writer is retried a few times, then given up to the others.
MAX_CLAIM_ROUNDS = 3
# How long a release may keep retrying after the holder's deadline: it is fenced, so late is safe.
RELEASE_BUDGET_SECONDS = 2.0


@dataclass(frozen=True)
class Lease:
    """What a holder knows of a connection it owns.

    ``last_seq`` is the checkpoint, ``None`` if the stream was never checkpointed (nothing of it
    is stored yet). ``desired_state`` is STOPPED when the row was claimed only to seal its log
    (see :class:`~streamfleet.worker.connection.Connection`).
    """

    pk: str
    ws_url: str
    last_seq: int | None
    lease_version: int
    owner: str
    session_version: int
    desired_state: str = STARTED
    dial_failures: int = 0  # consecutive failures of the stream before this lease

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Lease:
        last_seq = item.get(model.LAST_SEQ)
        return cls(
            pk=item[model.PK],
            ws_url=item.get(model.WS_URL, ""),
            last_seq=None if last_seq is None else int(last_seq),
            lease_version=int(item[model.LEASE_VERSION]),
            owner=item[model.LEASE_OWNER],
            session_version=int(item[model.LEASE_SESSION]),
            desired_state=item.get(model.DESIRED_STATE, STARTED),
            dial_failures=int(item.get(model.DIAL_FAILURES, 0)),
        )


@dataclass(frozen=True)
class Claimable:
    """A connection someone may claim: unowned, or owned by a session that has ended."""

    pk: str
    owner: str | None = None
    session_version: int | None = None


class ConnectionLeases:
    """The holder's operations on connection items, all attached to its current session."""

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        table_name: str,
        session: SessionKeeper,
        directory: SessionDirectory,
    ):
        self._dynamodb = dynamodb
        self._table = table_name
        self.session = session
        self.directory = directory
        # Streams seen held off (pk -> held_until_ms): discovery keeps naming them (the index
        # holds every unowned row), and each claim would be a failed write until the hold ends.
        self._held: dict[str, int] = {}

    @property
    def worker_id(self) -> str:
        return self.session.worker_id

    # -- acquisition ---------------------------------------------------------------------------

    async def acquire(self, pk: str, *, asked: bool = False) -> Lease | None:
        """Claim ``pk`` if it is claimable: STARTED and unowned, unowned and waiting to be sealed,
        or owned by a session that has expired, and not held off after a failure (``asked``: a
        notification named it, so what this worker remembers of a hold-off is asked again).

        ``None`` when it is not claimable (owned by a live session, STOPPED, or missing). Raises
        :class:`SessionLost` if this worker's own session is past its deadline.
        """
        if asked:
            # Named by a notification (a START): a hold-off this worker remembers may be over
            # already (a restart clears it); the row's condition still holds it if not.
            self._held.pop(pk, None)
        elif self.known_held(pk):
            return None
        return await self._claim_from(Claimable(pk))

    async def claim(self, candidate: Claimable) -> Lease | None:
        """Claim a candidate found by orphan discovery; ``None`` if someone was quicker.

        Discovery reads an index, which may be behind the row (or, on a store that lost a write
        half-way, out of step with it for good): a candidate whose row has another owner now is
        judged again on the row itself, so a stream whose current owner is gone is still taken.
        """
        if self.known_held(candidate.pk):
            return None
        current = await self._try_claim(candidate)
        if isinstance(current, Lease) or current is None:
            return current
        if self._is_held(candidate.pk, current):
            return None
        if (current.get(model.LEASE_OWNER), current.get(model.LEASE_SESSION)) == (
            candidate.owner,
            candidate.session_version,
        ):
            return None  # the same owner as discovered: not claimable for another reason
        next_candidate = await self._next_candidate(candidate.pk, current)
        return None if next_candidate is None else await self._claim_from(next_candidate)

    async def _claim_from(self, candidate: Claimable) -> Lease | None:
        for _ in range(MAX_CLAIM_ROUNDS):
            current = await self._try_claim(candidate)
            if isinstance(current, Lease):
                return current
            if current is None:
                return None
            next_candidate = await self._next_candidate(candidate.pk, current)
            if next_candidate is None:
                return None
            candidate = next_candidate
        return None

    async def _next_candidate(self, pk: str, current: dict[str, Any]) -> Claimable | None:
        """What to claim ``pk`` as, judged on its row as a failed claim saw it; ``None``: it is
        not claimable (owned by a live session, or STOPPED and not waiting for a sealer)."""
        owner = current.get(model.LEASE_OWNER)
        if owner is None:
            if current.get(model.DESIRED_STATE) != STARTED and model.AWAITING_OWNER not in current:
                return None
            return None if self._is_held(pk, current) else Claimable(pk)
        if current.get(model.DESIRED_STATE) != STARTED:
            return None  # its owner closes it (or reconcile clears it once the owner is gone)
        version = int(current[model.LEASE_SESSION])
        if not await self._owner_is_gone(owner, version):
            return None
        return Claimable(pk, owner, version)

    def known_held(self, pk: str) -> bool:
        """Whether this worker saw ``pk`` held off, until a time not yet reached."""
        held_until = self._held.get(pk)
        if held_until is None:
            return False
        if self._holds_now(held_until):
            return True
        del self._held[pk]
        return False

    def _is_held(self, pk: str, current: dict[str, Any]) -> bool:
        """Whether the row is unowned and held off after a failure (remembered until then)."""
        held_until = int(current.get(model.HELD_UNTIL_MS, 0))
        if model.LEASE_OWNER in current or not self._holds_now(held_until):
            return False
        self._held[pk] = held_until
        return True

    def _holds_now(self, held_until: int) -> bool:
        """Whether a hold that ends at ``held_until`` (the releaser's wall clock) still holds. A
        hold longer than the longest there is came from a clock far ahead: it holds nothing."""
        now = self.session.clock.wall_ms()
        return now < held_until <= self._latest_hold_end(now)

    def _latest_hold_end(self, now: int) -> int:
        return now + model.HOLD_OFF_CAP_MS + self.session.timing.max_clock_skew_ms

    async def _owner_is_gone(self, owner: str, version: int) -> bool:
        session = await self.directory.read(owner, version)
        if session is None:
            return True  # never existed or expired out of the table: nobody can renew it
        if not self.directory.is_expired(session):
            return False
        return await self.directory.fence(session)

    async def _try_claim(self, candidate: Claimable) -> Lease | dict[str, Any] | None:
        """One conditional write. Returns the lease, or the item as it stood if the write failed.

        An item that this very session already owns is returned as the lease: an earlier attempt
        of this claim was applied and its answer lost (or a notification was delivered twice).
        """
        my_version = self.session.require_live()
        now = self.session.clock.wall_ms()
        values = {
            ":me": to_attr(self.worker_id),
            ":session": to_attr(my_version),
            ":one": to_attr(1),
            ":started": to_attr(STARTED),
            ":now": to_attr(now),
            ":yes": to_attr(True),
        }
        if candidate.owner is None:
            # Unowned rows: STARTED ones, and STOPPED ones left waiting for an owner to seal them,
            # unless held off after a failure.
            ownership = (
                "attribute_not_exists(#lease_owner) AND "
                "(#desired_state = :started OR attribute_exists(#awaiting_owner)) AND "
                "(attribute_not_exists(#held_until_ms) OR #held_until_ms <= :now OR "
                "#held_until_ms > :latest_hold_end)"
            )
            values[":latest_hold_end"] = to_attr(self._latest_hold_end(now))
        else:
            ownership = (
                "#desired_state = :started AND "
                "#lease_owner = :owner AND #lease_session = :owner_session"
            )
            values[":owner"] = to_attr(candidate.owner)
            values[":owner_session"] = to_attr(candidate.session_version)
        try:
            response = await retry_until(
                lambda: self._dynamodb.call(
                    "update_item",
                    TableName=self._table,
                    Key={model.PK: to_attr(candidate.pk)},
                    UpdateExpression=(
                        "SET #lease_owner = :me, #lease_session = :session, "
                        "#updated_at_ms = :now, #unsealed = :yes "
                        "ADD #lease_version :one "
                        "REMOVE #awaiting_owner, #stop_requested_for"
                    ),
                    ConditionExpression=f"attribute_exists(#pk) AND {ownership}",
                    ExpressionAttributeNames=names(
                        model.PK,
                        model.LEASE_OWNER,
                        model.LEASE_SESSION,
                        model.LEASE_VERSION,
                        model.UPDATED_AT_MS,
                        model.UNSEALED,
                        model.AWAITING_OWNER,
                        model.STOP_REQUESTED_FOR,
                        model.DESIRED_STATE,
                        *([model.HELD_UNTIL_MS] if candidate.owner is None else []),
                    ),
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                deadline=self.session.deadline,
                clock=self.session.clock,
                what=f"acquire {candidate.pk}",
            )
        except Exception as exc:
            if not is_condition_failure(exc):
                raise
            current = await self._item_after_failure(exc, candidate.pk)
            if (
                current is not None
                and current.get(model.LEASE_OWNER) == self.worker_id
                and current.get(model.LEASE_SESSION) == my_version
            ):
                return Lease.from_item(current)
            return current
        return Lease.from_item(from_item(response["Attributes"]))

    async def _item_after_failure(self, exc: Exception, pk: str) -> dict[str, Any] | None:
        """The item a failed condition saw: from ``ALL_OLD`` when the server returns it (DynamoDB,
        moto), otherwise (dynalite) from a consistent read."""
        item = old_item_of(exc)  # type: ignore[arg-type]
        if item is not None:
            return item
        return await self.read(pk)

    # -- the holder's fenced writes ------------------------------------------------------------

    async def checkpoint(self, lease: Lease, last_seq: int, *, origin: bool = False) -> None:
        """Record that every message up to ``last_seq`` is stored (``origin``: this owner joins
        the stream live and nothing before ``last_seq`` will ever be stored).

        Never moves the checkpoint backwards: a checkpoint delivered late, after a later one,
        changes nothing and is not an error. Raises :class:`LeaseLost`, or :class:`SessionLost`
        when the lease belongs to a session that is over.
        """
        if self.session.require_live() != lease.session_version:
            raise SessionLost(f"{lease.pk}: held under session {lease.session_version}, now over")
        update = "SET #last_seq = :seq, #updated_at_ms = :now"
        if origin:
            update += ", #origin_seq = if_not_exists(#origin_seq, :seq)"
        if lease.dial_failures:
            update += " REMOVE #dial_failures, #held_until_ms, #last_failure"  # progress
        current = await self._fenced_update(
            lease,
            update=update,
            condition="(attribute_not_exists(#last_seq) OR #last_seq <= :seq)",
            extra_values={
                ":seq": to_attr(last_seq),
                ":now": to_attr(self.session.clock.wall_ms()),
            },
            deadline=self.session.deadline,
            what=f"checkpoint {lease.pk}",
        )
        if current is not None and not self._holds(lease, current):
            raise self._lost(lease, current)
        # Still ours: the checkpoint in the table is already later than this one.

    async def release(
        self, lease: Lease, *, sealed: bool = False, failure: str | None = None
    ) -> bool:
        """Give the connection up. ``True`` if it is now claimable, so a peer should be told.

        ``sealed``: the holder's final flush stored everything it received and checkpointed it,
        so the log has no hole past the checkpoint. A STARTED row is offered to the fleet; a
        STOPPED one is closed for good if sealed, and otherwise left claimable so that another
        worker seals its log.

        ``failure``: the holder failed with the stream (what went wrong). The row counts the
        failure and is held off, for the whole fleet, for :func:`~streamfleet.model.hold_off_ms`
        of the consecutive failures: claimable again only then (``True`` still means claimable,
        but nobody should be told now). The count is absolute (the lease's + 1), so a release
        applied twice counts once.

        Fenced: after someone else acquired it this raises :class:`LeaseLost` and changes
        nothing. A START or STOP that lands between attempts only changes which of the two forms
        applies. Allowed a little past the holder's deadline, since a fenced write is safe late.
        """
        clock = self.session.clock
        deadline = max(self.session.deadline, clock.monotonic() + RELEASE_BUDGET_SECONDS)
        removed = "#lease_owner, #lease_session, #stop_requested_for"
        if sealed:
            removed += ", #unsealed"
        now_ms = clock.wall_ms()
        values = {
            ":now": to_attr(now_ms),
            ":awaiting": to_attr(model.awaiting_owner_value(lease.pk)),
        }
        held = ""
        if failure is not None:
            failures = lease.dial_failures + 1
            held = ", #dial_failures = :failures, #held_until_ms = :until, #last_failure = :why"
            values[":failures"] = to_attr(failures)
            values[":until"] = to_attr(now_ms + model.hold_off_ms(failures, random.random()))
            values[":why"] = to_attr(failure[: model.MAX_FAILURE_CHARS] or "failed")
        for _ in range(MAX_CLAIM_ROUNDS):
            for desired, claimable in ((STARTED, True), (STOPPED, not sealed)):
                offer = ", #awaiting_owner = :awaiting" if claimable else ""
                values[":desired"] = to_attr(desired)
                current = await self._fenced_update(
                    lease,
                    update=f"REMOVE {removed} SET #updated_at_ms = :now{offer}{held}",
                    condition="#desired_state = :desired",
                    extra_values=values,
                    deadline=deadline,
                    what=f"release {lease.pk}",
                )
                if current is None:
                    return claimable
                if current.get(model.LEASE_VERSION) == lease.lease_version and (
                    current.get(model.LEASE_OWNER) is None
                ):
                    # An earlier attempt was applied and its answer lost: nobody has acquired
                    # it since (that would have raised the lease version).
                    return model.AWAITING_OWNER in current
                if not self._holds(lease, current):
                    raise self._lost(lease, current)
                # Still ours: its desired state differs from this form; try the other.
        raise StoreUnavailable(f"release {lease.pk}: START and STOP kept racing with it")

    @staticmethod
    def _holds(lease: Lease, item: dict[str, Any]) -> bool:
        return (
            item.get(model.LEASE_OWNER) == lease.owner
            and item.get(model.LEASE_VERSION) == lease.lease_version
        )

    @staticmethod
    def _lost(lease: Lease, item: dict[str, Any]) -> LeaseLost:
        version = item.get(model.LEASE_VERSION)
        return LeaseLost(
            lease.pk,
            item.get(model.LEASE_OWNER),
            "" if version == lease.lease_version else f" at lease_version {version}",
        )

    async def _fenced_update(
        self,
        lease: Lease,
        *,
        update: str,
        extra_values: dict[str, Any],
        deadline: float,
        what: str,
        condition: str = "",
    ) -> dict[str, Any] | None:
        """A write conditioned on owning the lease (and ``condition``). ``None`` if it was
        applied; otherwise the item as the failed condition saw it (``{}`` if missing)."""
        condition_expression = "#lease_owner = :me AND #lease_version = :lease_version"
        if condition:
            condition_expression += f" AND {condition}"
        expression = f"{update} {condition_expression}"
        attribute_names = {
            key: value
            for key, value in names(
                model.LEASE_OWNER,
                model.LEASE_VERSION,
                model.LEASE_SESSION,
                model.LAST_SEQ,
                model.ORIGIN_SEQ,
                model.UPDATED_AT_MS,
                model.AWAITING_OWNER,
                model.STOP_REQUESTED_FOR,
                model.DESIRED_STATE,
                model.UNSEALED,
                *model.HOLD_OFF_ATTRIBUTES,
            ).items()
            if key in expression
        }
        values = {
            ":me": to_attr(lease.owner),
            ":lease_version": to_attr(lease.lease_version),
            **extra_values,
        }
        try:
            await retry_until(
                lambda: self._dynamodb.call(
                    "update_item",
                    TableName=self._table,
                    Key={model.PK: to_attr(lease.pk)},
                    UpdateExpression=update,
                    ConditionExpression=condition_expression,
                    ExpressionAttributeNames=attribute_names,
                    ExpressionAttributeValues={
                        key: value for key, value in values.items() if key in expression
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                deadline=deadline,
                clock=self.session.clock,
                what=what,
            )
        except Exception as exc:
            if not is_condition_failure(exc):
                raise
            return await self._item_after_failure(exc, lease.pk) or {}
        return None

    # -- reads -----------------------------------------------------------------------------------

    async def read(self, pk: str) -> dict[str, Any] | None:
        """A connection item, read consistently."""
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item", TableName=self._table, Key={model.PK: to_attr(pk)}, ConsistentRead=True
            ),
            deadline=self.session.clock.monotonic() + self.session.timing.lease_seconds,
            clock=self.session.clock,
            what=f"read {pk}",
        )
        return from_item(response.get("Item"))

    async def read_many(self, pks: list[str]) -> dict[str, dict[str, Any]]:
        """Connection items by key, consistently, in batches of 100 (retrying unprocessed keys)."""
        items = await batch_get(
            self._dynamodb,
            table_name=self._table,
            keys=[{model.PK: to_attr(pk)} for pk in dict.fromkeys(pks)],
            consistent=True,
            clock=self.session.clock,
            deadline=self.session.clock.monotonic() + self.session.timing.lease_seconds,
            what="read connections",
        )
        return {item[model.PK]: item for item in items}

    async def mine(self) -> list[Lease]:
        """Every connection the table says this session owns: one ``by-owner`` query.

        The worker compares it with what it runs, to release rows it holds but does not run
        (a release that failed while the session stayed live). The index may lag a little.
        """
        version = self.session.require_live()
        items = await query_all(
            self._dynamodb,
            clock=self.session.clock,
            deadline=self.session.clock.monotonic() + self.session.timing.heartbeat_seconds,
            what="query own connections",
            TableName=self._table,
            IndexName=model.OWNER_INDEX.name,
            KeyConditionExpression="#lease_owner = :me",
            FilterExpression="#lease_session = :version",
            ExpressionAttributeNames=names(model.LEASE_OWNER, model.LEASE_SESSION),
            ExpressionAttributeValues={
                ":me": to_attr(self.worker_id),
                ":version": to_attr(version),
            },
        )
        return [Lease.from_item(item) for item in items]

    async def stop_requested(self) -> list[str]:
        """Keys of the connections this worker was asked to stop: one index query.

        The index is eventually consistent, so the answer may lag a STOP by a moment and may still
        list one that a new START cancelled; confirm with :meth:`read_many` before acting.
        """
        items = await query_all(
            self._dynamodb,
            clock=self.session.clock,
            deadline=self.session.clock.monotonic() + self.session.timing.heartbeat_seconds,
            what="query stopped connections",
            TableName=self._table,
            IndexName=model.STOP_REQUESTED_INDEX.name,
            KeyConditionExpression="#stop_requested_for = :me",
            ExpressionAttributeNames=names(model.STOP_REQUESTED_FOR),
            ExpressionAttributeValues={":me": to_attr(self.worker_id)},
        )
        return [item[model.PK] for item in items]

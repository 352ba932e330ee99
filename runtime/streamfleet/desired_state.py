"""START and STOP: the only writers of ``desired_state`` (the event router calls these).

START never disturbs a running lease (a conditional write: an overwriting ``put_item`` would
reset the lease its owner holds); STOP flags the row for its current owner through the sparse
``stop-requested`` index, so each worker finds its stopped connections with one query instead of
polling each one.

A START's ``ws_url`` and ``readers`` land in one conditional write, so a readers change applies
only to the START that made it. A START naming another ``ws_url`` than the stream's is refused
(``CONFLICT``) unless the stream never had a source to speak of: stopped, unowned, and nothing
of it ever stored (no origin, no checkpoint). A stream's log never mixes two sources, and no
answer names a URL that nobody is dialling; a new source takes a new connection id.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from . import model
from .aws import AsyncClient
from .clock import SYSTEM_CLOCK, Clock
from .lease.connections import Lease
from .lease.dynamo import from_item, is_condition_failure, names, retry_until, to_attr
from .validation import check_ws_url

STARTED = model.DesiredState.STARTED.value
STOPPED = model.DesiredState.STOPPED.value
# Each round is one conditional write chosen from the row as last seen; a row that keeps changing
# under us (an acquisition, a release) settles within a few rounds.
MAX_ROUNDS = 5
DEADLINE_SECONDS = 10.0


class Outcome(StrEnum):
    """What a START or STOP did."""

    CREATED = "created"  # START of a new connection
    RESTARTED = "restarted"  # START of a STOPPED connection
    UNCHANGED = "unchanged"  # START of a STARTED one, STOP of a STOPPED one (idempotent)
    STOPPED = "stopped"
    NOT_FOUND = "not_found"  # STOP of a connection that never existed
    CONFLICT = "conflict"  # START of a running connection with another ws_url


@dataclass(frozen=True)
class Result:
    """The outcome, the item as it now stands, and whether the fleet should be notified."""

    outcome: Outcome
    item: dict[str, Any] | None
    notify: bool = False
    detail: str = ""  # why, for a CONFLICT


RUNNING_ELSEWHERE = "the connection is running with another ws_url; STOP it"
ANOTHER_SOURCE = (
    "the connection has a log from another ws_url, or is still closing; a new source needs a "
    "new connection id"
)


def _has_history(item: dict[str, Any]) -> bool:
    """Whether anything of the stream was ever stored, or may still be (its log has a source)."""
    return any(
        name in item
        for name in (model.ORIGIN_SEQ, model.LAST_SEQ, model.UNSEALED, model.LEASE_OWNER)
    )


def _readers_update(
    readers: tuple[str, ...] | None,
) -> tuple[str, str, dict[str, Any]]:
    """The SET and REMOVE clauses (each with a leading comma, or empty) and the values that
    write ``readers`` (``None``: leave them; ``()``: nobody)."""
    if readers is None:
        return "", "", {}
    if readers:
        return ", #readers = :readers", "", {":readers": to_attr(set(readers))}
    return "", ", #readers", {}  # DynamoDB has no empty set: no attribute is no reader


class DesiredStateWriter:
    """Conditional writes of ``desired_state`` on connection items."""

    def __init__(self, *, dynamodb: AsyncClient, table_name: str, clock: Clock = SYSTEM_CLOCK):
        self._dynamodb = dynamodb
        self._table = table_name
        self._clock = clock

    async def start(
        self, connection_id: str, ws_url: str, readers: tuple[str, ...] | None = None
    ) -> Result:
        """Ask for the connection to run, with ``readers`` if given (``()``: nobody) in the same
        write. ``notify``: a worker should claim it now."""
        # Every path that writes a START row checks the URL the same way (the allow-list is the
        # caller's: the router's and the CLI's configuration).
        check_ws_url(model.WS_URL, ws_url)
        pk = model.connection_pk(connection_id)
        set_readers, remove_readers, reader_values = _readers_update(readers)
        current = None
        for _ in range(MAX_ROUNDS):
            if current is None:
                written = await self._write(
                    pk,
                    # No last_seq: "never checkpointed", so its first owner joins it live and
                    # records where it began (origin_seq) before storing anything.
                    update=(
                        "SET #desired_state = :started, #ws_url = :url, "
                        "#lease_version = :zero, #awaiting_owner = :awaiting, "
                        f"#updated_at_ms = :now{set_readers}"
                        + (f" REMOVE {remove_readers[2:]}" if remove_readers else "")
                    ),
                    condition="attribute_not_exists(#pk)",
                    values={":zero": to_attr(0), ":url": to_attr(ws_url), **reader_values},
                )
                if written is not None:
                    return Result(Outcome.CREATED, written, notify=True)
            elif current.get(model.WS_URL) != ws_url and (
                current.get(model.DESIRED_STATE) == STARTED or _has_history(current)
            ):
                detail = (
                    RUNNING_ELSEWHERE
                    if current.get(model.DESIRED_STATE) == STARTED
                    else ANOTHER_SOURCE
                )
                return Result(Outcome.CONFLICT, current, detail=detail)
            elif current.get(model.DESIRED_STATE) == STARTED:
                if readers is None:
                    return Result(Outcome.UNCHANGED, current)
                written = await self._write(
                    pk,
                    update=f"SET #updated_at_ms = :now{set_readers}"
                    + (f" REMOVE {remove_readers[2:]}" if remove_readers else ""),
                    condition="#desired_state = :started AND #ws_url = :url",
                    values={":url": to_attr(ws_url), **reader_values},
                )
                if written is not None:
                    return Result(Outcome.UNCHANGED, written)
            elif current.get(model.LEASE_OWNER) is None:
                written = await self._write(
                    pk,
                    update=(
                        "SET #desired_state = :started, #ws_url = :url, "
                        f"#awaiting_owner = :awaiting, #updated_at_ms = :now{set_readers} "
                        # A restart is somebody's decision to try again: no hold-off left over.
                        "REMOVE #refused_reason, #dial_failures, #held_until_ms, #last_failure"
                        f"{remove_readers}"
                    ),
                    # The URL it was stopped with, or none ever stored: see _has_history.
                    condition=(
                        "#desired_state = :stopped AND attribute_not_exists(#lease_owner) AND "
                        "(#ws_url = :url OR (attribute_not_exists(#origin_seq) AND "
                        "attribute_not_exists(#last_seq) AND attribute_not_exists(#unsealed)))"
                    ),
                    values={":url": to_attr(ws_url), ":stopped": to_attr(STOPPED), **reader_values},
                )
                if written is not None:
                    return Result(Outcome.RESTARTED, written, notify=True)
            else:
                # Still owned: its owner has not closed it yet, so it simply keeps running (on
                # the same URL: another one was refused above).
                written = await self._write(
                    pk,
                    update=(
                        f"SET #desired_state = :started, #updated_at_ms = :now{set_readers} "
                        f"REMOVE #stop_requested_for{remove_readers}"
                    ),
                    condition=(
                        "#desired_state = :stopped AND #lease_owner = :owner AND #ws_url = :url"
                    ),
                    values={
                        ":url": to_attr(ws_url),
                        ":stopped": to_attr(STOPPED),
                        ":owner": to_attr(current[model.LEASE_OWNER]),
                        **reader_values,
                    },
                )
                if written is not None:
                    return Result(Outcome.RESTARTED, written)
            current = await self.read(pk)
        raise RuntimeError(f"{pk}: START kept racing with other writers")

    async def stop(self, connection_id: str) -> Result:
        """Ask for the connection to stop; its owner (if any) is flagged to close it."""
        pk = model.connection_pk(connection_id)
        current = await self.read(pk)
        for _ in range(MAX_ROUNDS):
            if current is None:
                return Result(Outcome.NOT_FOUND, None)
            if current.get(model.DESIRED_STATE) == STOPPED:
                return Result(Outcome.UNCHANGED, current)
            owner = current.get(model.LEASE_OWNER)
            if owner is None and model.UNSEALED in current:
                # Its last owner never sealed its log (it may hold a hole past the checkpoint):
                # it stays claimable, and the worker that takes it seals the log and closes it,
                # at once: a hold-off after a failure to dial is no reason to wait (one to seal
                # holds it again).
                written = await self._write(
                    pk,
                    update="SET #desired_state = :stopped, #updated_at_ms = :now "
                    "REMOVE #held_until_ms",
                    condition="#desired_state = :started AND attribute_not_exists(#lease_owner) "
                    "AND attribute_exists(#unsealed)",
                    values={":stopped": to_attr(STOPPED)},
                )
            elif owner is None:
                written = await self._write(
                    pk,
                    update="SET #desired_state = :stopped, #updated_at_ms = :now "
                    "REMOVE #awaiting_owner",
                    condition="#desired_state = :started AND attribute_not_exists(#lease_owner) "
                    "AND attribute_not_exists(#unsealed)",
                    values={":stopped": to_attr(STOPPED)},
                )
            else:
                written = await self._write(
                    pk,
                    update="SET #desired_state = :stopped, #stop_requested_for = :owner, "
                    "#updated_at_ms = :now",
                    condition="#desired_state = :started AND #lease_owner = :owner",
                    values={":stopped": to_attr(STOPPED), ":owner": to_attr(owner)},
                )
            if written is not None:
                return Result(Outcome.STOPPED, written)
            current = await self.read(pk)
        raise RuntimeError(f"{pk}: STOP kept racing with other writers")

    async def refuse(self, lease: Lease, reason: str) -> None:
        """Mark a connection its owner will not dial (its URL is not allowed), and stop it.

        Fenced like every holder's write: after a takeover it changes nothing.
        """
        await self._write(
            lease.pk,
            update="SET #desired_state = :stopped, #refused_reason = :reason, "
            "#updated_at_ms = :now REMOVE #awaiting_owner, #stop_requested_for",
            condition="#lease_owner = :owner AND #lease_version = :lease_version",
            values={
                ":stopped": to_attr(STOPPED),
                ":reason": to_attr(reason),
                ":owner": to_attr(lease.owner),
                ":lease_version": to_attr(lease.lease_version),
            },
        )

    async def read(self, pk: str) -> dict[str, Any] | None:
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item", TableName=self._table, Key={model.PK: to_attr(pk)}, ConsistentRead=True
            ),
            deadline=self._clock.monotonic() + DEADLINE_SECONDS,
            clock=self._clock,
            what=f"read {pk}",
        )
        return from_item(response.get("Item"))

    async def _write(
        self, pk: str, *, update: str, condition: str, values: dict[str, Any]
    ) -> dict[str, Any] | None:
        """One conditional update; the new item, or ``None`` if the condition failed."""
        all_values = {
            ":now": to_attr(self._clock.wall_ms()),
            ":started": to_attr(STARTED),
            ":awaiting": to_attr(model.awaiting_owner_value(pk)),
            **values,
        }
        expression = f"{update} {condition}"
        used_values = {key: value for key, value in all_values.items() if key in expression}
        used_names = {
            key: value
            for key, value in names(
                model.PK,
                model.DESIRED_STATE,
                model.WS_URL,
                model.LAST_SEQ,
                model.LEASE_VERSION,
                model.LEASE_OWNER,
                model.AWAITING_OWNER,
                model.STOP_REQUESTED_FOR,
                model.UPDATED_AT_MS,
                model.REFUSED_REASON,
                model.UNSEALED,
                model.READERS,
                model.ORIGIN_SEQ,
                *model.HOLD_OFF_ATTRIBUTES,
            ).items()
            if key in expression
        }
        try:
            response = await retry_until(
                lambda: self._dynamodb.call(
                    "update_item",
                    TableName=self._table,
                    Key={model.PK: to_attr(pk)},
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=used_names,
                    ExpressionAttributeValues=used_values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                deadline=self._clock.monotonic() + DEADLINE_SECONDS,
                clock=self._clock,
                what=f"write {pk}",
            )
        except Exception as exc:
            if is_condition_failure(exc):
                return None  # the caller re-reads consistently and decides again
            raise
        return from_item(response["Attributes"])

"""START and STOP: the only writers of ``desired_state`` (the event router calls these).

START never disturbs a running lease (a conditional write, not the seed's overwriting
``put_item``); STOP flags the row for its current owner through the sparse ``stop-requested``
index, so each worker finds its stopped connections with one query instead of polling each one.
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


class DesiredStateWriter:
    """Conditional writes of ``desired_state`` on connection items."""

    def __init__(self, *, dynamodb: AsyncClient, table_name: str, clock: Clock = SYSTEM_CLOCK):
        self._dynamodb = dynamodb
        self._table = table_name
        self._clock = clock

    async def start(self, connection_id: str, ws_url: str) -> Result:
        """Ask for the connection to run. ``notify``: a worker should claim it now."""
        pk = model.connection_pk(connection_id)
        current = None
        for _ in range(MAX_ROUNDS):
            if current is None:
                written = await self._write(
                    pk,
                    # No last_seq: "never checkpointed", so its first owner joins it live and
                    # records where it began (origin_seq) before storing anything.
                    update=(
                        "SET #desired_state = :started, #ws_url = :url, "
                        "#lease_version = :zero, #awaiting_owner = :awaiting, #updated_at_ms = :now"
                    ),
                    condition="attribute_not_exists(#pk)",
                    values={":zero": to_attr(0), ":url": to_attr(ws_url)},
                )
                if written is not None:
                    return Result(Outcome.CREATED, written, notify=True)
            elif current.get(model.DESIRED_STATE) == STARTED:
                if current.get(model.WS_URL) != ws_url:
                    return Result(Outcome.CONFLICT, current)
                return Result(Outcome.UNCHANGED, current)
            elif current.get(model.LEASE_OWNER) is None:
                written = await self._write(
                    pk,
                    update=(
                        "SET #desired_state = :started, #ws_url = :url, "
                        "#awaiting_owner = :awaiting, #updated_at_ms = :now REMOVE #refused_reason"
                    ),
                    condition=("#desired_state = :stopped AND attribute_not_exists(#lease_owner)"),
                    values={":url": to_attr(ws_url), ":stopped": to_attr(STOPPED)},
                )
                if written is not None:
                    return Result(Outcome.RESTARTED, written, notify=True)
            else:
                # Still owned: its owner has not closed it yet, so it simply keeps running.
                written = await self._write(
                    pk,
                    update=(
                        "SET #desired_state = :started, #ws_url = :url, #updated_at_ms = :now "
                        "REMOVE #stop_requested_for"
                    ),
                    condition="#desired_state = :stopped AND #lease_owner = :owner",
                    values={
                        ":url": to_attr(ws_url),
                        ":stopped": to_attr(STOPPED),
                        ":owner": to_attr(current[model.LEASE_OWNER]),
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
                # it stays claimable, and the worker that takes it seals the log and closes it.
                written = await self._write(
                    pk,
                    update="SET #desired_state = :stopped, #updated_at_ms = :now",
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

    async def set_readers(
        self, connection_id: str, readers: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """Replace who may subscribe to the stream (``()``: nobody). Touches nothing a lease
        depends on; ``None`` if the connection does not exist."""
        pk = model.connection_pk(connection_id)
        if readers:
            update = "SET #readers = :readers, #updated_at_ms = :now"
            values = {":readers": to_attr(set(readers))}
        else:  # DynamoDB has no empty set: no attribute is no reader
            update = "SET #updated_at_ms = :now REMOVE #readers"
            values = {}
        return await self._write(
            pk, update=update, condition="attribute_exists(#pk)", values=values
        )

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
            ":awaiting": to_attr(model.AWAITING_OWNER_VALUE),
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

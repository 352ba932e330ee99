"""The state table: a write that versions its item (``updated_at_ms``, strictly increasing)
and a consistent read, in this Region's replica or another's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from ... import model
from ...clock import Clock
from ...lease.dynamo import from_item, is_condition_failure, names, to_attr

# Retries of a state write whose only failed condition was "newer than the stored version".
MAX_VERSION_RETRIES = 8


@dataclass(frozen=True)
class StateReplica:
    """One Region's replica of the state table: where a write goes and who it says wrote it."""

    region: str
    table: str
    client: Any


class StateWriteConflict(RuntimeError):
    """A state item kept changing under a write for ``MAX_VERSION_RETRIES`` attempts."""


@dataclass(frozen=True)
class WriteOutcome:
    """What :meth:`StateStore.write` did: written (at ``timestamp_ms``) or refused by
    the caller's condition (``current`` is the item that refused it)."""

    written: bool
    timestamp_ms: int
    current: dict[str, Any] | None


class StateStore:
    """Writes and reads of the state table, in this Region's replica unless told otherwise."""

    def __init__(self, local: StateReplica, clock: Clock):
        self.local = local
        self.clock = clock

    def write(
        self,
        pk: str,
        *,
        sets: Mapping[str, Any],
        adds: Mapping[str, Any] | None = None,
        deletes: Mapping[str, set[str]] | None = None,
        condition: str | None = None,
        condition_names: tuple[str, ...] = (),
        condition_values: Mapping[str, Any] | None = None,
        still_applies: Callable[[dict[str, Any]], bool] | None = None,
        replica: StateReplica | None = None,
    ) -> WriteOutcome:
        """Update a state item, stamping ``updated_at_ms`` strictly above its previous value.

        Why: the timestamp is the item's version as clients see it (``updatedAtMs``), so it must
        grow in the order DynamoDB applies the writes to one replica, whatever the clocks of the
        Lambdas say. (Global tables settle concurrent writes from two Regions on their own write
        time, not on it: that is why each auction has one writing Region.)
        The write is conditioned on ``updated_at_ms < :ts``; when only that part fails (the
        caller's ``condition`` still applies to the item read back), it is retried just above
        the stored value. When the caller's condition fails, nothing is written and the current
        item is returned. ``replica``: where to write (default: this Region's).
        """
        replica = replica or self.local
        timestamp = self.clock.wall_ms()
        version_names = (model.UPDATED_AT_MS, model.WRITER_REGION)
        all_names = names(*version_names, *sets, *(adds or {}), *(deletes or {}), *condition_names)
        version_condition = (
            f"(attribute_not_exists(#{model.UPDATED_AT_MS}) OR #{model.UPDATED_AT_MS} < :ts)"
        )
        # DynamoDB rejects redundant parentheses, so add them only where OR needs them.
        full_condition = (
            f"({condition}) AND {version_condition}"
            if condition
            else version_condition.removeprefix("(").removesuffix(")")
        )
        set_parts = [f"#{name} = :s_{index}" for index, name in enumerate(sets)]
        set_parts += [f"#{model.UPDATED_AT_MS} = :ts", f"#{model.WRITER_REGION} = :region"]
        expression = "SET " + ", ".join(set_parts)
        if adds:
            expression += " ADD " + ", ".join(
                f"#{name} :a_{index}" for index, name in enumerate(adds)
            )
        if deletes:
            expression += " DELETE " + ", ".join(
                f"#{name} :d_{index}" for index, name in enumerate(deletes)
            )
        for _ in range(MAX_VERSION_RETRIES):
            values = {
                **{f":s_{index}": to_attr(value) for index, value in enumerate(sets.values())},
                **{
                    f":a_{index}": to_attr(value)
                    for index, value in enumerate((adds or {}).values())
                },
                **{
                    f":d_{index}": to_attr(value)
                    for index, value in enumerate((deletes or {}).values())
                },
                **{key: to_attr(value) for key, value in (condition_values or {}).items()},
                ":ts": to_attr(timestamp),
                ":region": to_attr(replica.region),
            }
            try:
                replica.client.update_item(
                    TableName=replica.table,
                    Key={model.PK: to_attr(pk)},
                    UpdateExpression=expression,
                    ConditionExpression=full_condition,
                    ExpressionAttributeNames=all_names,
                    ExpressionAttributeValues=values,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return WriteOutcome(True, timestamp, None)
            except ClientError as exc:
                if not is_condition_failure(exc):
                    raise
                current = from_item(exc.response.get("Item")) or self.read(pk, replica)
            if current is None:
                continue  # deleted between the write and the read: try again
            if still_applies is not None and not still_applies(current):
                return WriteOutcome(False, timestamp, current)
            timestamp = max(self.clock.wall_ms(), int(current.get(model.UPDATED_AT_MS, 0)) + 1)
        raise StateWriteConflict(f"{pk}: still changing after {MAX_VERSION_RETRIES} attempts")

    def read(self, pk: str, replica: StateReplica | None = None) -> dict[str, Any] | None:
        replica = replica or self.local
        return from_item(
            replica.client.get_item(
                TableName=replica.table,
                Key={model.PK: to_attr(pk)},
                ConsistentRead=True,
            ).get("Item")
        )

"""Create tables on a local server exactly as the synthesized templates declare them.

Local mode, the tests and the drill need the app's tables where there is no CloudFormation (a
local DynamoDB server). Their key schema, attribute types, indexes with projections, TTL and
stream are read from the cloud assembly (:mod:`streamfleet_dev.assembly`), not from a second
description: a table here is what ``cdk deploy`` would create. The assembly is the one
``cdk.json`` configures (synthesized once per process and cached across runs by a hash of its
inputs; ``$STREAMFLEET_ASSEMBLY`` names an existing ``cdk.out`` instead).

A :class:`~streamfleet.model.TableSpec` names which table is meant (its ``default_name`` is the
template's ``TableName``); a :class:`~streamfleet_dev.assembly.TableDefinition` can be passed
directly. Local servers do not all implement everything a template asks for (dynalite has
neither streams nor TTL): what a server did not apply is returned, never silently claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamfleet import model
from streamfleet_dev.assembly import TableDefinition, default_assembly

TableRef = model.TableSpec | TableDefinition
WAITER_CONFIG = {"Delay": 0.2, "MaxAttempts": 150}


@dataclass(frozen=True)
class CreatedTable:
    """A table created from its definition, and what the server could not apply."""

    name: str
    definition: TableDefinition
    not_applied: tuple[str, ...] = ()


def table_definition(table: TableRef) -> TableDefinition:
    """The synthesized definition of ``table`` (a model spec is looked up by its name)."""
    if isinstance(table, TableDefinition):
        return table
    return default_assembly().table(table.default_name)


def create_table_request(table: TableRef, table_name: str) -> dict[str, Any]:
    """``CreateTable`` parameters for ``table`` as synthesized, named ``table_name``.

    TTL is not a ``CreateTable`` parameter: :func:`create_table` applies it afterwards.
    """
    return table_definition(table).create_table_request(table_name)


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def finish_table(dynamodb: Any, table: TableRef, table_name: str) -> CreatedTable:
    """Wait until ``table_name`` is active, then apply the definition's TTL; report what the
    server did not apply (TTL or stream)."""
    definition = table_definition(table)
    dynamodb.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig=WAITER_CONFIG)
    missing: list[str] = []
    if definition.ttl_attribute:
        try:
            dynamodb.update_time_to_live(
                TableName=table_name,
                TimeToLiveSpecification={
                    "Enabled": True,
                    "AttributeName": definition.ttl_attribute,
                },
            )
        except Exception as exc:
            if _error_code(exc) not in ("UnknownOperationException", "UnrecognizedClientException"):
                raise
            missing.append(f"TTL on {definition.ttl_attribute}")
    if definition.stream_view_type:
        described = dynamodb.describe_table(TableName=table_name)["Table"]
        if not (described.get("StreamSpecification") or {}).get("StreamEnabled"):
            missing.append(f"stream ({definition.stream_view_type})")
    return CreatedTable(table_name, definition, tuple(missing))


def create_table(dynamodb: Any, table: TableRef, table_name: str) -> CreatedTable:
    """Create one table as synthesized (keys, indexes, stream), wait for it, apply its TTL."""
    dynamodb.create_table(**create_table_request(table, table_name))
    return finish_table(dynamodb, table, table_name)


def create_tables(dynamodb: Any, *, lease_table: str, messages_table: str) -> list[CreatedTable]:
    """Create the lease and messages tables with a synchronous boto3 client, as synthesized,
    and wait until they are active (TTL applied where the server supports it)."""
    pairs = ((model.LEASE_TABLE, lease_table), (model.MESSAGES_TABLE, messages_table))
    for spec, name in pairs:
        dynamodb.create_table(**create_table_request(spec, name))
    return [finish_table(dynamodb, spec, name) for spec, name in pairs]

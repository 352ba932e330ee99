"""Create the WebSocket API's tables from the data model (local servers, tests, the drill).

The CDK half declares the same tables from the same :mod:`streamfleet.model` specs: the state
table as a global table (replicated), the connections and subscriptions tables as regional
tables with TTL. Their key schemas are read from the synthesized templates.
"""

from __future__ import annotations

from typing import Any

from streamfleet import model
from streamfleet_dev.tables import create_table_request

# What global tables need on the replicated table (and what the local replicator reads).
STATE_TABLE_STREAM = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}


def create_wsapi_tables(
    dynamodb: Any,
    *,
    state_table: str,
    connections_table: str,
    stream: bool = False,
    subscriptions_table: str | None = None,
) -> None:
    """Create the tables with a synchronous boto3 client and wait until they are active.

    ``stream`` enables the state table's DynamoDB stream (new and old images), as a global
    table has it; the local drill's replicator reads it. ``subscriptions_table`` also creates
    the Region's subscriptions table (live delivery).
    """
    pairs = [
        (model.WSAPI_STATE_TABLE, state_table),
        (model.WSAPI_CONNECTIONS_TABLE, connections_table),
    ]
    if subscriptions_table is not None:
        pairs.append((model.WSAPI_SUBSCRIPTIONS_TABLE, subscriptions_table))
    for spec, name in pairs:
        request = create_table_request(spec, name)
        if stream and spec is model.WSAPI_STATE_TABLE:
            request["StreamSpecification"] = STATE_TABLE_STREAM
        dynamodb.create_table(**request)
    waiter = dynamodb.get_waiter("table_exists")
    for _, name in pairs:
        waiter.wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 150})


def delete_wsapi_tables(
    dynamodb: Any,
    *,
    state_table: str,
    connections_table: str,
    subscriptions_table: str | None = None,
) -> None:
    """Delete the tables (tests clean up after themselves)."""
    for name in (state_table, connections_table, subscriptions_table):
        if name is not None:
            dynamodb.delete_table(TableName=name)

"""Create the tables and queue from the data model (local mode, tests, first deploy checks).

The CDK constructs declare the same tables from the same :mod:`streamfleet.model` specs; this is
the boto3 twin used where there is no CloudFormation (a local server).
"""

from __future__ import annotations

from typing import Any

from streamfleet import model


def create_table_request(spec: model.TableSpec, table_name: str) -> dict[str, Any]:
    """``CreateTable`` parameters for ``spec`` (on-demand billing)."""
    attribute_types = {spec.partition_key: "S"}
    key_schema = [{"AttributeName": spec.partition_key, "KeyType": "HASH"}]
    if spec.sort_key:
        attribute_types[spec.sort_key] = spec.sort_key_type
        key_schema.append({"AttributeName": spec.sort_key, "KeyType": "RANGE"})
    indexes = []
    for index in spec.indexes:
        index_keys = [{"AttributeName": index.partition_key, "KeyType": "HASH"}]
        attribute_types.setdefault(index.partition_key, "S")
        if index.sort_key:
            index_keys.append({"AttributeName": index.sort_key, "KeyType": "RANGE"})
            attribute_types.setdefault(index.sort_key, "S")
        projection: dict[str, Any] = {"ProjectionType": index.projection.value}
        if index.non_key_attributes:
            projection["NonKeyAttributes"] = list(index.non_key_attributes)
        indexes.append({"IndexName": index.name, "KeySchema": index_keys, "Projection": projection})
    request: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind} for name, kind in attribute_types.items()
        ],
        "KeySchema": key_schema,
        "BillingMode": "PAY_PER_REQUEST",
    }
    if indexes:
        request["GlobalSecondaryIndexes"] = indexes
    return request


def create_tables(dynamodb: Any, *, lease_table: str, messages_table: str) -> None:
    """Create both tables with a synchronous boto3 client and wait until they are active."""
    for spec, name in ((model.LEASE_TABLE, lease_table), (model.MESSAGES_TABLE, messages_table)):
        dynamodb.create_table(**create_table_request(spec, name))
    waiter = dynamodb.get_waiter("table_exists")
    for name in (lease_table, messages_table):
        waiter.wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 150})

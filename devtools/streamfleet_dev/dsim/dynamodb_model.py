"""DynamoDB in process, small and strict, for the deterministic simulations.

:class:`DynamoDBModel` has the interface of
:class:`~streamfleet_dev.dsim.moto_reference.MotoDynamoDB`
(``call(operation, params)`` with botocore's snake_case operation names and the wire JSON's
typed attribute values; ``model.put_item(**params)``; ``create_table``; ``stream_records``;
``close``) and answers the calls the runtime makes (``get_item``, ``put_item``, ``update_item``,
``delete_item``, ``query``, ``scan``, ``batch_get_item``, ``batch_write_item``) and those that
set tables up (``create_table``, ``delete_table``, ``describe_table``, ``list_tables``,
``update_time_to_live``, ``describe_time_to_live``), as DynamoDB documents them, without moto:
expressions are parsed once per text (:mod:`~streamfleet_dev.dsim.expressions`), items are
copied only where they cross the model's boundary.

Strict, like DynamoDB: a request DynamoDB would refuse raises ``ClientError`` with DynamoDB's
code (``ValidationException`` for unused or undefined ``#names`` and ``:values``, key
attributes missing, extra, empty or of the wrong type, an item over 400 KB, an update of a key
attribute...). What DynamoDB accepts but this model does not implement (another operation, a
legacy parameter such as ``Expected``, consumed capacity, parallel scans, local secondary
indexes) is refused by name (``UnknownOperationException`` or ``ValidationException``), never
answered approximately.

Deterministic: no clock, no randomness, no order from hashing. Stream records carry counters
(``eventID``, ``SequenceNumber``) where DynamoDB has random ids and times; ``expire`` is TTL's
deletion, run when the simulation says it is time. Single-threaded: the simulations call it
from one thread.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from botocore.exceptions import ClientError

from streamfleet_dev.dsim.attribute_values import copy_item, copy_value, import_item, number
from streamfleet_dev.dsim.document_paths import apply_update, plan_update, project
from streamfleet_dev.dsim.dynamodb_errors import (
    IN_USE,
    NOT_FOUND,
    UNKNOWN_OPERATION,
    DynamoDBError,
    invalid,
    unsupported,
)
from streamfleet_dev.dsim.dynamodb_reads import query, scan
from streamfleet_dev.dsim.dynamodb_requests import (
    PARAMETERS,
    UPDATE_RETURN_VALUES,
    check_capacity,
    check_condition,
    check_write_options,
    choice,
    expression_attributes,
    operation_name,
    output,
    parse_optional,
    projection_paths,
    refuse_parameters,
    required,
)
from streamfleet_dev.dsim.dynamodb_tables import TTL_IDENTITY, Item, Table, TableKey, new_table
from streamfleet_dev.dsim.expressions import (
    CONDITION,
    PROJECTION,
    UPDATE,
    parse_condition,
    parse_projection,
    parse_update,
)
from streamfleet_dev.dsim.store_calls import StoreCalls

ACCOUNT = "123456789012"
_INSTANCES = itertools.count(1)

MAX_BATCH_GET_KEYS = 100
MAX_BATCH_WRITE_REQUESTS = 25


class DynamoDBModel(StoreCalls):
    """One DynamoDB Region of its own, answered synchronously in the caller's thread."""

    def __init__(self, region: str = "us-east-1"):
        self.region = region
        self.account = ACCOUNT
        self.meta = SimpleNamespace(endpoint_url=f"inprocess://dynamodb-model/{next(_INSTANCES)}")
        self._tables: dict[str, Table] = {}
        self._sequence = 0  # the last stream record's sequence number, across tables
        self._operations: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "get_item": self._get_item,
            "put_item": self._put_item,
            "update_item": self._update_item,
            "delete_item": self._delete_item,
            "query": self._query,
            "scan": self._scan,
            "batch_get_item": self._batch_get_item,
            "batch_write_item": self._batch_write_item,
            "create_table": self._create_table,
            "delete_table": self._delete_table,
            "describe_table": self._describe_table,
            "list_tables": self._list_tables,
            "update_time_to_live": self._update_time_to_live,
            "describe_time_to_live": self._describe_time_to_live,
        }

    # --- The client's interface ------------------------------------------------------------

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """``operation`` (botocore's snake_case name) with ``params``; the answer, or
        ``ClientError`` as DynamoDB would raise it."""
        answer = self._operations.get(operation)
        if answer is None:
            raise _client_error(
                operation,
                DynamoDBError(
                    UNKNOWN_OPERATION, f"DynamoDBModel does not answer {operation_name(operation)}"
                ),
            )
        try:
            if not params.keys() <= PARAMETERS[operation]:
                refuse_parameters(operation, params)
            return answer(params)
        except DynamoDBError as error:
            raise _client_error(operation, error) from None

    def stream_records(self, table_name: str) -> Callable[[], list[dict[str, Any]]]:
        """A reader of ``table_name``'s change stream: every record so far, in order, as
        Lambda's event source hands them to a function (a new list each call; the records
        themselves are shared between calls and must not be modified).

        As DynamoDB Streams: one record per write that changed its item (none for a write that
        left it as it was, nor for a delete of nothing), with the images the table's
        ``StreamViewType`` asks for. ``eventID`` counts the table's records from ``"0"``;
        ``SequenceNumber`` increases (zero-padded, so it also orders as text); there is no
        ``ApproximateCreationDateTime``."""
        table = self._table(table_name)
        return lambda: list(table.stream_records())

    def expire(self, now_seconds: float) -> int:
        """TTL's deletion, now: every item whose table's TTL attribute is a number below
        ``now_seconds``, deleted with a ``REMOVE`` record whose ``userIdentity`` is DynamoDB's
        service, as TTL deletes. Tables by name, items in key order; how many were deleted.

        (DynamoDB deletes expired items within days, not at once: the simulation decides when
        to call this.)"""
        now = Decimal(now_seconds)
        deleted = 0
        for name in sorted(self._tables):
            table = self._tables[name]
            attribute = table.ttl_attribute
            if attribute is None:
                continue
            for key in list(table.scan_order()):
                item = table.items[key]
                value = item.get(attribute)
                if value is not None and "N" in value and number(value["N"]) < now:
                    self._write(table, key, item, None, user_identity=TTL_IDENTITY)
                    deleted += 1
        return deleted

    def close(self) -> None:
        """Forget every table."""
        self._tables.clear()

    # --- Items -------------------------------------------------------------------------------

    def _get_item(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        check_capacity(params)
        if type(params.get("ConsistentRead", False)) is not bool:
            raise invalid("ConsistentRead: expected true or false")
        key = table.key_of(required(params, "Key"))
        projection = parse_optional(params, "ProjectionExpression", parse_projection)
        names, _ = expression_attributes(params, ((PROJECTION, projection),))
        item = table.items.get(key)
        if item is None:
            return {}
        return {"Item": output(item, projection_paths(projection, names))}

    def _put_item(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        return_values = choice(params, "ReturnValues", ("NONE", "ALL_OLD"))
        on_failure = choice(params, "ReturnValuesOnConditionCheckFailure", ("NONE", "ALL_OLD"))
        check_write_options(params)
        item = import_item(required(params, "Item"))
        key = table.key_of_item(item)
        size = table.check_item(item, updating=False)
        condition = parse_optional(params, "ConditionExpression", parse_condition)
        names, values = expression_attributes(params, ((CONDITION, condition),))
        old = table.items.get(key)
        check_condition(condition, old, names, values, on_failure)
        self._write(table, key, old, item, size)
        if return_values == "ALL_OLD" and old is not None:
            return {"Attributes": copy_item(old)}
        return {}

    def _update_item(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        return_values = choice(params, "ReturnValues", UPDATE_RETURN_VALUES)
        on_failure = choice(params, "ReturnValuesOnConditionCheckFailure", ("NONE", "ALL_OLD"))
        check_write_options(params)
        request_key = required(params, "Key")
        key = table.key_of(request_key)
        update = parse_optional(params, "UpdateExpression", parse_update)
        condition = parse_optional(params, "ConditionExpression", parse_condition)
        names, values = expression_attributes(params, ((UPDATE, update), (CONDITION, condition)))
        targets = plan_update(update, names, values, table.key_names) if update else ()
        old = table.items.get(key)
        check_condition(condition, old, names, values, on_failure)
        base = old if old is not None else table.key_item(request_key)
        new = apply_update(update, targets, base, names, values) if update else dict(base)
        size = table.check_item(new, updating=True)
        self._write(table, key, old, new, size)
        if return_values == "NONE":
            return {}
        if return_values == "ALL_OLD":
            return {"Attributes": copy_item(old)} if old is not None else {}
        if return_values == "ALL_NEW":
            return {"Attributes": copy_item(new)}
        # UPDATED_*: the attributes the update names, whether or not their values changed.
        source = old if return_values == "UPDATED_OLD" else new
        attributes = project(source, list(targets), copy_value) if source is not None else {}
        return {"Attributes": attributes} if attributes else {}

    def _delete_item(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        return_values = choice(params, "ReturnValues", ("NONE", "ALL_OLD"))
        on_failure = choice(params, "ReturnValuesOnConditionCheckFailure", ("NONE", "ALL_OLD"))
        check_write_options(params)
        key = table.key_of(required(params, "Key"))
        condition = parse_optional(params, "ConditionExpression", parse_condition)
        names, values = expression_attributes(params, ((CONDITION, condition),))
        old = table.items.get(key)
        check_condition(condition, old, names, values, on_failure)
        if old is None:
            return {}
        self._write(table, key, old, None)
        return {"Attributes": copy_item(old)} if return_values == "ALL_OLD" else {}

    def _write(
        self,
        table: Table,
        key: TableKey,
        old: Item | None,
        new: Item | None,
        size: int = 0,
        *,
        user_identity: dict[str, str] | None = None,
    ) -> None:
        if table.write(
            key, old, new, size, sequence=self._sequence + 1, user_identity=user_identity
        ):
            self._sequence += 1

    # --- Batches -----------------------------------------------------------------------------

    def _batch_get_item(self, params: dict[str, Any]) -> dict[str, Any]:
        requests = required(params, "RequestItems")
        check_capacity(params)
        if type(requests) is not dict or not requests:
            raise invalid("1 validation error detected: RequestItems must not be empty")
        if sum(len(request.get("Keys") or ()) for request in requests.values()) > (
            MAX_BATCH_GET_KEYS
        ):
            raise invalid("Too many items requested for the BatchGetItem call")
        planned = []
        for table_name, request in requests.items():
            allowed = {"Keys", "ConsistentRead", "ProjectionExpression", "ExpressionAttributeNames"}
            extra = sorted(set(request) - allowed)
            if extra:
                raise unsupported(f"the parameter {extra[0]} of BatchGetItem's RequestItems")
            table = self._table(table_name)
            keys = [table.key_of(key) for key in required(request, "Keys")]
            if not keys:
                raise invalid("1 validation error detected: Keys must not be empty")
            if len(set(keys)) != len(keys):
                raise invalid("Provided list of item keys contains duplicates")
            projection = parse_optional(request, "ProjectionExpression", parse_projection)
            names, _ = expression_attributes(request, ((PROJECTION, projection),))
            planned.append((table, table_name, keys, projection_paths(projection, names)))
        responses: dict[str, list[Item]] = {}
        for table, table_name, keys, paths in planned:
            found = responses.setdefault(table_name, [])
            for key in keys:
                item = table.items.get(key)
                if item is not None:
                    found.append(output(item, paths))
        return {"Responses": responses, "UnprocessedKeys": {}}

    def _batch_write_item(self, params: dict[str, Any]) -> dict[str, Any]:
        requests = required(params, "RequestItems")
        if type(requests) is not dict or not requests:
            raise invalid("1 validation error detected: RequestItems must not be empty")
        if sum(len(writes) for writes in requests.values()) > MAX_BATCH_WRITE_REQUESTS:
            raise invalid(
                "1 validation error detected: Value at 'requestItems' failed to satisfy "
                "constraint: Map value must satisfy constraint: [Member must have length less "
                "than or equal to 25, Member must have length greater than or equal to 1]"
            )
        if params.get("ReturnItemCollectionMetrics", "NONE") not in ("NONE", "SIZE"):
            raise invalid("ReturnItemCollectionMetrics: expected NONE or SIZE")
        check_capacity(params)
        # Every request is checked before any is applied: DynamoDB refuses the batch whole.
        planned: list[tuple[Table, TableKey, Item | None, int]] = []
        seen: set[tuple[str, TableKey]] = set()
        for table_name, writes in requests.items():
            table = self._table(table_name)
            if type(writes) is not list or not writes:
                raise invalid("1 validation error detected: a table's write requests are empty")
            for write in writes:
                if type(write) is not dict or len(write) != 1:
                    raise invalid(
                        "Supplied WriteRequest has more than one request set or none, must "
                        "contain exactly one of PutRequest and DeleteRequest"
                    )
                ((kind, request),) = write.items()
                if kind == "PutRequest":
                    item = import_item(required(request, "Item"))
                    key = table.key_of_item(item)
                    planned.append((table, key, item, table.check_item(item, updating=False)))
                elif kind == "DeleteRequest":
                    key = table.key_of(required(request, "Key"))
                    planned.append((table, key, None, 0))
                else:
                    raise invalid(f"Unknown write request {kind}")
                if (table_name, key) in seen:
                    raise invalid("Provided list of item keys contains duplicates")
                seen.add((table_name, key))
        for table, key, item, size in planned:
            self._write(table, key, table.items.get(key), item, size)
        return {"UnprocessedItems": {}}

    # --- Query and scan --------------------------------------------------------------------

    def _query(self, params: dict[str, Any]) -> dict[str, Any]:
        return query(self._table(required(params, "TableName")), params)

    def _scan(self, params: dict[str, Any]) -> dict[str, Any]:
        return scan(self._table(required(params, "TableName")), params)

    # --- Tables ------------------------------------------------------------------------------

    def _create_table(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("TableName")
        if name in self._tables:
            raise DynamoDBError(IN_USE, f"Table already exists: {name}")
        # A stream's label is its creation time: the tables' order of creation instead.
        label = f"1970-01-01T00:00:00.{len(self._tables):03d}"
        table = new_table(params, self.region, self.account, label)
        self._tables[table.name] = table
        return {"TableDescription": table.describe("ACTIVE")}

    def _delete_table(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        del self._tables[table.name]
        return {"TableDescription": table.describe("DELETING")}

    def _describe_table(self, params: dict[str, Any]) -> dict[str, Any]:
        name = required(params, "TableName")
        if name not in self._tables:
            raise DynamoDBError(NOT_FOUND, f"Requested resource not found: Table: {name} not found")
        return {"Table": self._tables[name].describe()}

    def _list_tables(self, params: dict[str, Any]) -> dict[str, Any]:
        limit = params.get("Limit", 100)
        if type(limit) is not int or not 1 <= limit <= 100:
            raise invalid("Limit: must be between 1 and 100")
        names = sorted(self._tables)
        after = params.get("ExclusiveStartTableName")
        if after is not None:
            names = names[bisect.bisect_right(names, after) :]
        answer: dict[str, Any] = {"TableNames": names[:limit]}
        if len(names) > limit:
            answer["LastEvaluatedTableName"] = names[limit - 1]
        return answer

    def _update_time_to_live(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        specification = required(params, "TimeToLiveSpecification")
        attribute = specification.get("AttributeName")
        enabled = specification.get("Enabled")
        if type(attribute) is not str or not attribute or type(enabled) is not bool:
            raise invalid("TimeToLiveSpecification: AttributeName and Enabled are required")
        if enabled and table.ttl_attribute is not None:
            raise invalid("TimeToLive is already enabled")
        if not enabled:
            if table.ttl_attribute is None:
                raise invalid("TimeToLive is already disabled")
            if table.ttl_attribute != attribute:
                raise invalid(
                    "TimeToLive is active on a different AttributeName: current AttributeName "
                    f"is {table.ttl_attribute}"
                )
        table.ttl_attribute = attribute if enabled else None
        return {"TimeToLiveSpecification": {"Enabled": enabled, "AttributeName": attribute}}

    def _describe_time_to_live(self, params: dict[str, Any]) -> dict[str, Any]:
        table = self._table(required(params, "TableName"))
        if table.ttl_attribute is None:
            return {"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}
        return {
            "TimeToLiveDescription": {
                "TimeToLiveStatus": "ENABLED",
                "AttributeName": table.ttl_attribute,
            }
        }

    def _table(self, name: Any) -> Table:
        table = self._tables.get(name)
        if table is None:
            raise DynamoDBError(NOT_FOUND, "Requested resource not found")
        return table


# --- Answers ----------------------------------------------------------------------------------


def _client_error(operation: str, error: DynamoDBError) -> ClientError:
    """``error`` as botocore raises DynamoDB's answer (and as ``MotoDynamoDB`` does)."""
    response: dict[str, Any] = {
        "Error": {"Code": error.code, "Message": error.message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    if error.item is not None:
        response["Item"] = error.item
    return ClientError(response, operation_name(operation))  # type: ignore[arg-type]

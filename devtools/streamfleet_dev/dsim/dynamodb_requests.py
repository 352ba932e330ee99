"""What a DynamoDB request may carry, checked as DynamoDB checks it, and how an item leaves.

The checks that do not depend on a table's contents: which parameters an operation takes (any
other is refused by name, a legacy one such as ``Expected`` included), enumerations
(``ReturnValues``, ``Select``...), and the agreement between a request's expressions and its
``ExpressionAttributeNames`` / ``ExpressionAttributeValues``, which DynamoDB enforces both ways:
every placeholder an expression uses is defined, and every one defined is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamfleet_dev.dsim.attribute_values import copy_item, copy_value, import_value
from streamfleet_dev.dsim.document_paths import Path, check_disjoint, project, resolve
from streamfleet_dev.dsim.dynamodb_errors import (
    CONDITION_FAILED,
    DynamoDBError,
    invalid,
    unsupported,
)
from streamfleet_dev.dsim.dynamodb_tables import Index, Item
from streamfleet_dev.dsim.expressions import CONDITION, FILTER, PROJECTION, check_value_types

_FAILED = "The conditional request failed"
_NAMES, _VALUES = "ExpressionAttributeNames", "ExpressionAttributeValues"
SELECTS = ("ALL_ATTRIBUTES", "ALL_PROJECTED_ATTRIBUTES", "SPECIFIC_ATTRIBUTES", "COUNT")
UPDATE_RETURN_VALUES = ("NONE", "ALL_OLD", "ALL_NEW", "UPDATED_OLD", "UPDATED_NEW")
_EXPRESSION_ATTRIBUTES = ("ExpressionAttributeNames", "ExpressionAttributeValues")
_WRITE_OPTIONS = (
    "ConditionExpression",
    *_EXPRESSION_ATTRIBUTES,
    "ReturnValues",
    "ReturnValuesOnConditionCheckFailure",
    "ReturnConsumedCapacity",
    "ReturnItemCollectionMetrics",
)
_READ_OPTIONS = (
    "IndexName",
    "FilterExpression",
    "ProjectionExpression",
    *_EXPRESSION_ATTRIBUTES,
    "Limit",
    "ExclusiveStartKey",
    "ConsistentRead",
    "Select",
    "ReturnConsumedCapacity",
)
# What each operation takes; any other parameter is refused by name.
PARAMETERS: dict[str, frozenset[str]] = {
    "get_item": frozenset(
        (
            "TableName",
            "Key",
            "ConsistentRead",
            "ProjectionExpression",
            "ExpressionAttributeNames",
            "ReturnConsumedCapacity",
        )
    ),
    "put_item": frozenset(("TableName", "Item", *_WRITE_OPTIONS)),
    "update_item": frozenset(("TableName", "Key", "UpdateExpression", *_WRITE_OPTIONS)),
    "delete_item": frozenset(("TableName", "Key", *_WRITE_OPTIONS)),
    "query": frozenset(("TableName", "KeyConditionExpression", "ScanIndexForward", *_READ_OPTIONS)),
    "scan": frozenset(("TableName", *_READ_OPTIONS)),
    "batch_get_item": frozenset(("RequestItems", "ReturnConsumedCapacity")),
    "batch_write_item": frozenset(
        ("RequestItems", "ReturnConsumedCapacity", "ReturnItemCollectionMetrics")
    ),
    "create_table": frozenset(
        (
            "TableName",
            "AttributeDefinitions",
            "KeySchema",
            "GlobalSecondaryIndexes",
            "StreamSpecification",
            "BillingMode",
            "ProvisionedThroughput",
        )
    ),
    "delete_table": frozenset(("TableName",)),
    "describe_table": frozenset(("TableName",)),
    "list_tables": frozenset(("Limit", "ExclusiveStartTableName")),
    "update_time_to_live": frozenset(("TableName", "TimeToLiveSpecification")),
    "describe_time_to_live": frozenset(("TableName",)),
}
_LEGACY = frozenset(
    (
        "AttributesToGet",
        "Expected",
        "ConditionalOperator",
        "AttributeUpdates",
        "KeyConditions",
        "QueryFilter",
        "ScanFilter",
    )
)


def refuse_parameters(operation: str, params: dict[str, Any]) -> None:
    """Refuse, by name, a parameter ``operation`` does not take (called when one is there)."""
    for name in sorted(params.keys() - PARAMETERS[operation]):
        if name in _LEGACY:
            raise unsupported(f"the legacy parameter {name} (use an expression instead)")
        raise unsupported(f"the parameter {name} of {operation_name(operation)}")


def required(params: dict[str, Any], name: str) -> Any:
    value = params.get(name)
    if value is None:
        raise invalid(
            f"1 validation error detected: Value null at '{name}' failed to satisfy "
            "constraint: Member must not be null"
        )
    return value


def choice(
    params: dict[str, Any], name: str, allowed: tuple[str, ...], default: str | None = "NONE"
) -> Any:
    value = params.get(name, default)
    if value is not default and value not in allowed:
        raise invalid(
            f"1 validation error detected: Value '{value}' at '{name}' failed to satisfy "
            f"constraint: Member must satisfy enum value set: [{', '.join(allowed)}]"
        )
    return value


def check_capacity(params: dict[str, Any]) -> None:
    if params.get("ReturnConsumedCapacity", "NONE") != "NONE":
        raise unsupported(f"ReturnConsumedCapacity {params['ReturnConsumedCapacity']}")


def check_write_options(params: dict[str, Any]) -> None:
    check_capacity(params)
    if params.get("ReturnItemCollectionMetrics", "NONE") not in ("NONE", "SIZE"):
        raise invalid("ReturnItemCollectionMetrics: expected NONE or SIZE")


def parse_optional(params: dict[str, Any], name: str, parse: Callable[[str], Any]) -> Any:
    text = params.get(name)
    return None if text is None else parse(text)


def expression_attributes(
    params: dict[str, Any], expressions: tuple[tuple[str, Any], ...]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The request's ``ExpressionAttributeNames`` and (imported) ``ExpressionAttributeValues``,
    refused as DynamoDB refuses them: given without an expression, empty, a placeholder an
    expression uses but the request does not define, or one the request defines but no
    expression uses."""
    names = params.get("ExpressionAttributeNames")
    raw_values = params.get("ExpressionAttributeValues")
    present = [(label, parsed) for label, parsed in expressions if parsed is not None]
    if not present:
        for given, field in ((names, _NAMES), (raw_values, _VALUES)):
            if given is not None:
                raise invalid(f"{field} can only be specified when using expressions")
        return {}, {}
    for given, field in ((names, _NAMES), (raw_values, _VALUES)):
        if given is not None and (type(given) is not dict or not given):
            raise invalid(f"{field} must not be empty")
    names = names or {}
    raw_values = raw_values or {}
    if len(present) == 1:
        used_names, used_values = present[0][1].names, present[0][1].values
    else:
        used_names = frozenset().union(*(parsed.names for _, parsed in present))
        used_values = frozenset().union(*(parsed.values for _, parsed in present))
    if names.keys() != used_names or raw_values.keys() != used_values:
        _refuse_placeholders(present, names, raw_values, used_names, used_values)
    for placeholder, attribute in names.items():
        if type(attribute) is not str or not attribute:
            raise invalid(f"ExpressionAttributeNames: {placeholder} must name an attribute")
    values = {name: import_value(value) for name, value in raw_values.items()}
    for label, parsed in present:
        if label in (CONDITION, FILTER) and parsed.value_types:
            check_value_types(parsed, values, label)
    return names, values


def _refuse_placeholders(
    present: list[tuple[str, Any]],
    names: dict[str, str],
    values: dict[str, Any],
    used_names: frozenset[str],
    used_values: frozenset[str],
) -> None:
    """The error for placeholders the expressions and the request do not agree on."""
    for label, parsed in present:
        for name in sorted(parsed.names - names.keys()):
            raise invalid(
                f"Invalid {label}: An expression attribute name used in the document path is "
                f"not defined; attribute name: {name}"
            )
        for value in sorted(parsed.values - values.keys()):
            raise invalid(
                f"Invalid {label}: An expression attribute value used in expression is not "
                f"defined; attribute value: {value}"
            )
    unused = sorted(names.keys() - used_names)
    if unused:
        raise invalid(
            "Value provided in ExpressionAttributeNames unused in expressions: keys: "
            f"{{{', '.join(unused)}}}"
        )
    unused = sorted(values.keys() - used_values)
    raise invalid(
        "Value provided in ExpressionAttributeValues unused in expressions: keys: "
        f"{{{', '.join(unused)}}}"
    )


def check_condition(
    condition: Any,
    old: Item | None,
    names: dict[str, str],
    values: dict[str, Any],
    on_failure: str,
) -> None:
    if condition is None or condition.evaluate(old if old is not None else {}, names, values):
        return
    returned = copy_item(old) if on_failure == "ALL_OLD" and old is not None else None
    raise DynamoDBError(CONDITION_FAILED, _FAILED, returned)


def check_select(select: str | None, projection: Any, index: Index | None) -> None:
    if select is None:
        return
    if select == "SPECIFIC_ATTRIBUTES" and projection is None:
        raise invalid(
            "1 validation error detected: Must specify the AttributesToGet or "
            "ProjectionExpression when choosing to get SPECIFIC_ATTRIBUTES"
        )
    if select != "SPECIFIC_ATTRIBUTES" and projection is not None:
        what = "only the Count" if select == "COUNT" else select
        raise invalid(
            f"1 validation error detected: Cannot specify the ProjectionExpression when "
            f"choosing to get {what}"
        )
    if select == "ALL_PROJECTED_ATTRIBUTES" and index is None:
        raise invalid(
            "1 validation error detected: ALL_PROJECTED_ATTRIBUTES can be used only when "
            "Querying using an IndexName"
        )
    if select == "ALL_ATTRIBUTES" and index is not None and index.projection_type != "ALL":
        raise invalid(
            "One or more parameter values were invalid: Select type ALL_ATTRIBUTES is not "
            f"supported for global secondary index {index.name} because its projection type "
            "is not ALL"
        )


def projection_paths(projection: Any, names: dict[str, str]) -> list[Path] | None:
    """The paths a ``ProjectionExpression`` names (``None`` without one)."""
    if projection is None:
        return None
    paths = [resolve(path, names) for path in projection.paths]
    check_disjoint(paths, PROJECTION)
    return paths


def output(item: Item, paths: list[Path] | None) -> Item:
    """An item as it leaves the model: copied, and projected if the request asks."""
    return copy_item(item) if paths is None else project(item, paths, copy_value)


def operation_name(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))

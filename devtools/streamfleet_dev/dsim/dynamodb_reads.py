"""Query and Scan of a :class:`~streamfleet_dev.dsim.dynamodb_tables.Table`: one page at a time.

A query bisects the partition's sorted entries for its sort-key condition; a scan walks every
item in key order. Either reads at most ``Limit`` items (counted before the filter, as DynamoDB
counts them) and at most 1 MB, and names where it stopped in ``LastEvaluatedKey`` whenever it
stopped there, even if nothing is left (as DynamoDB documents for ``Limit``). Through an index,
the items are what the index projects, and ``LastEvaluatedKey`` holds the table's key and the
index's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from streamfleet_dev.dsim.attribute_values import kind_of, order_key
from streamfleet_dev.dsim.document_paths import resolve
from streamfleet_dev.dsim.dynamodb_errors import invalid
from streamfleet_dev.dsim.dynamodb_requests import (
    SELECTS,
    check_capacity,
    check_select,
    choice,
    expression_attributes,
    output,
    parse_optional,
    projection_paths,
)
from streamfleet_dev.dsim.dynamodb_tables import Index, Item, Table, TableKey
from streamfleet_dev.dsim.expressions import (
    FILTER,
    KEY_CONDITION,
    PROJECTION,
    check_value_types,
    parse_condition,
    parse_key_condition,
    parse_projection,
)

MAX_PAGE_BYTES = 1024 * 1024  # a Query or Scan reads at most 1 MB per page


def query(table: Table, params: dict[str, Any]) -> dict[str, Any]:
    """A ``Query`` of ``table``."""
    index = _requested_index(table, params)
    if "KeyConditionExpression" not in params:
        raise invalid(
            "Either the KeyConditions or KeyConditionExpression parameter must be "
            "specified in the request."
        )
    key_condition = parse_key_condition(params["KeyConditionExpression"])
    filter_expression = parse_optional(
        params, "FilterExpression", lambda text: parse_condition(text, FILTER)
    )
    projection = parse_optional(params, "ProjectionExpression", parse_projection)
    names, values = expression_attributes(
        params,
        (
            (KEY_CONDITION, key_condition),
            (FILTER, filter_expression),
            (PROJECTION, projection),
        ),
    )
    hash_name = index.hash_key if index else table.hash_key
    range_name = index.range_key if index else table.range_key
    hash_term, range_term = None, None
    for term in key_condition.terms:
        attribute = resolve((term.name,), names)[0]
        if attribute == hash_name and hash_term is None:
            if term.operator != "=":
                raise invalid("Query key condition not supported")
            hash_term = term
        elif attribute == range_name and range_term is None:
            range_term = term
        else:
            raise invalid("Query key condition not supported")
        for value_name in term.values:
            if table.attribute_types[attribute] not in values[value_name]:
                raise invalid(
                    "One or more parameter values were invalid: Condition parameter type "
                    "does not match schema type"
                )
    if hash_term is None:
        raise invalid(f"Query condition missed key schema element: {hash_name}")
    if filter_expression is not None:
        for path in filter_expression.paths:
            attribute = resolve(path[:1], names)[0]
            if attribute in (hash_name, range_name):
                raise invalid(
                    "Filter Expression can only contain non-primary key attributes: "
                    f"Primary key attribute: {attribute}"
                )
    hash_order = order_key(values[hash_term.values[0]])
    if index is None:
        if table.range_key is None:
            present = (hash_order,) in table.items
            entries: list[Any] = [(hash_order,)] if present else []
            sort_of = None
        else:
            entries = table.partitions.get(hash_order, [])
            sort_of = None
    else:
        entries = index.partitions.get(hash_order, [])
        sort_of = _first if index.range_key else None
    low, high = 0, len(entries)
    if range_term is not None:
        low, high = _sort_key_range(
            entries, sort_of, range_term.operator, [values[v] for v in range_term.values]
        )
    return _read_page(
        table,
        index,
        params,
        entries,
        low,
        high,
        hash_order,
        filter_expression,
        projection,
        names,
        values,
    )


def scan(table: Table, params: dict[str, Any]) -> dict[str, Any]:
    """A ``Scan`` of ``table``."""
    index = _requested_index(table, params)
    filter_expression = parse_optional(
        params, "FilterExpression", lambda text: parse_condition(text, FILTER)
    )
    projection = parse_optional(params, "ProjectionExpression", parse_projection)
    names, values = expression_attributes(
        params, ((FILTER, filter_expression), (PROJECTION, projection))
    )
    if index is None:
        entries: list[Any] = table.scan_order()
    else:
        entries = [
            (partition, position)
            for partition in sorted(index.partitions)
            for position in index.partitions[partition]
        ]
    return _read_page(
        table,
        index,
        params,
        entries,
        0,
        len(entries),
        None,
        filter_expression,
        projection,
        names,
        values,
    )


def _read_page(
    table: Table,
    index: Index | None,
    params: dict[str, Any],
    entries: list[Any],
    low: int,
    high: int,
    hash_order: Any,
    filter_expression: Any,
    projection: Any,
    names: dict[str, str],
    values: dict[str, Any],
) -> dict[str, Any]:
    """One page of a query (``hash_order`` given: ``entries`` are one partition's) or a
    scan, from ``entries[low:high]``: at most ``Limit`` items read (before the filter, as
    DynamoDB counts) and at most 1 MB."""
    select = choice(params, "Select", SELECTS, default=None)
    check_select(select, projection, index)
    check_capacity(params)
    if filter_expression is not None:
        check_value_types(filter_expression, values, FILTER)
    forward = params.get("ScanIndexForward", True)
    if type(forward) is not bool:
        raise invalid("ScanIndexForward: expected true or false")
    limit = params.get("Limit")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise invalid(
            f"1 validation error detected: Value '{limit}' at 'limit' failed to satisfy "
            "constraint: Member must have value greater than or equal to 1"
        )
    if type(params.get("ConsistentRead", False)) is not bool:
        raise invalid("ConsistentRead: expected true or false")
    scanning = hash_order is None
    start = params.get("ExclusiveStartKey")
    if start is not None:
        position = _start_position(table, index, start, scanning, hash_order)
        if forward:
            low = max(low, bisect.bisect_right(entries, position, low, high))
        else:
            high = min(high, bisect.bisect_left(entries, position, low, high))
    if index is None:
        if scanning or table.range_key is None:

            def key_of(entry: Any) -> TableKey:
                return entry

        else:

            def key_of(entry: Any) -> TableKey:
                return (hash_order, entry)

    else:
        ranged = index.range_key is not None

        def key_of(entry: Any) -> TableKey:
            position = entry[1] if scanning else entry
            return position[1] if ranged else position

    order: Iterable[int] = range(low, high) if forward else range(high - 1, low - 1, -1)
    found: list[Item] = []
    scanned = 0
    size = 0
    last_key: TableKey | None = None
    previous: TableKey | None = None
    for at in order:
        table_key = key_of(entries[at])
        item_bytes = table.sizes[table_key]
        if scanned and size + item_bytes > MAX_PAGE_BYTES:
            last_key = previous
            break
        size += item_bytes
        scanned += 1
        item = table.items[table_key]
        visible = index.project(item) if index is not None else item
        if filter_expression is None or filter_expression.evaluate(visible, names, values):
            found.append(visible)
        previous = table_key
        if scanned == limit:
            # DynamoDB stops at Limit and names where it stopped, more items or not.
            last_key = table_key
            break
    answer: dict[str, Any] = {}
    if select != "COUNT":
        paths = projection_paths(projection, names)
        answer["Items"] = [output(item, paths) for item in found]
    answer["Count"] = len(found)
    answer["ScannedCount"] = scanned
    if last_key is not None:
        answer["LastEvaluatedKey"] = table.key_attributes(table.items[last_key], index)
    return answer


def _requested_index(table: Table, params: dict[str, Any]) -> Index | None:
    name = params.get("IndexName")
    if name is None:
        return None
    index = table.indexes.get(name)
    if index is None:
        raise invalid(f"The table does not have the specified index: {name}")
    if params.get("ConsistentRead"):
        raise invalid("Consistent reads are not supported on global secondary indexes")
    return index


def _first(entry: tuple[Any, ...]) -> Any:
    return entry[0]


def _sort_key_range(
    entries: list[Any],
    sort_of: Callable[[Any], Any] | None,
    operator: str,
    operands: list[dict[str, Any]],
) -> tuple[int, int]:
    """The slice of a partition's sorted ``entries`` whose sort key satisfies the condition."""
    bound = order_key(operands[0])
    if operator == "=":
        return (
            bisect.bisect_left(entries, bound, key=sort_of),
            bisect.bisect_right(entries, bound, key=sort_of),
        )
    if operator == "<":
        return 0, bisect.bisect_left(entries, bound, key=sort_of)
    if operator == "<=":
        return 0, bisect.bisect_right(entries, bound, key=sort_of)
    if operator == ">":
        return bisect.bisect_right(entries, bound, key=sort_of), len(entries)
    if operator == ">=":
        return bisect.bisect_left(entries, bound, key=sort_of), len(entries)
    if operator == "BETWEEN":
        upper = order_key(operands[1])
        if bound > upper:
            raise invalid(
                "Invalid KeyConditionExpression: The BETWEEN operator requires upper bound to "
                "be greater than or equal to lower bound; lower bound operand: AttributeValue: "
                f"{operands[0]}, upper bound operand: AttributeValue: {operands[1]}"
            )
        return (
            bisect.bisect_left(entries, bound, key=sort_of),
            bisect.bisect_right(entries, upper, key=sort_of),
        )
    # begins_with: the sort keys from the prefix on, as long as they start with it.
    if kind_of(operands[0]) not in ("S", "B"):
        raise invalid(
            "Invalid KeyConditionExpression: Incorrect operand type for operator or function; "
            "operator or function: begins_with, operand type: NUMBER"
        )
    low = bisect.bisect_left(entries, bound, key=sort_of)
    high = low
    while high < len(entries):
        sort_key = entries[high] if sort_of is None else sort_of(entries[high])
        if not sort_key.startswith(bound):
            break
        high += 1
    return low, high


def _start_position(
    table: Table, index: Index | None, start: Any, scanning: bool, hash_order: Any
) -> Any:
    """Where ``ExclusiveStartKey`` stands among the entries being read."""
    if type(start) is not dict:
        raise invalid("The provided starting key is invalid")
    names = list(table.key_names)
    if index is not None:
        names += [n for n in (index.hash_key, index.range_key) if n and n not in names]
    if set(start) != set(names):
        raise invalid(
            "The provided starting key is invalid: The provided key element does not match the "
            "schema"
        )
    table_key = table.key_of({name: start[name] for name in table.key_names})
    if index is None:
        if scanning or table.range_key is None:
            return table_key
        if table_key[0] != hash_order:
            raise invalid("The provided starting key is outside query boundaries")
        return table_key[1]
    orders = {}
    for name in (index.hash_key, index.range_key):
        if name is not None:
            value = start[name]
            if type(value) is not dict or table.attribute_types[name] not in value:
                raise invalid("The provided starting key is invalid")
            orders[name] = order_key(value)
    index_hash = orders[index.hash_key]
    if index.range_key is None:
        position: Any = table_key
    else:
        position = (orders[index.range_key], table_key)
    if scanning:
        return (index_hash, position)
    if index_hash != hash_order:
        raise invalid("The provided starting key is outside query boundaries")
    return position

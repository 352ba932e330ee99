"""A table of :class:`~streamfleet_dev.dsim.dynamodb_model.DynamoDBModel`: its schema, items,
global secondary indexes and change stream.

Items are kept by their key's *order tuple* (each key value's :func:`order_key`: numbers by
value, so ``{"N": "5"}`` and ``{"N": "5.0"}`` are one key, as in DynamoDB). Alongside, sorted
lists make queries a bisection rather than a sort: each partition's sort keys, and each index
partition's ``(index sort key, table key)`` pairs. An index entry names the item by its table
key, so an index reads the item as the table holds it, and a write that leaves an item's index
keys alone does not touch the index.

Orders are deterministic: a partition by sort key; an index partition by index sort key, then
by table key (DynamoDB leaves the order of equal index sort keys unspecified; moto orders them
the same way); a scan by partition key, then sort key (DynamoDB scans in hash order, which no
client may rely on).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from streamfleet_dev.dsim.attribute_values import (
    MAX_ITEM_BYTES,
    binary,
    copy_item,
    copy_value,
    import_value,
    item_size,
    items_equal,
    kind_of,
    number,
    order_key,
    text_size,
)
from streamfleet_dev.dsim.dynamodb_errors import invalid, unsupported

Item = dict[str, dict[str, Any]]
TableKey = tuple[Any, ...]

MAX_PARTITION_KEY_BYTES = 2048
MAX_SORT_KEY_BYTES = 1024
_BAD_KEY = "The provided key element does not match the schema"
_IMAGES = {
    "KEYS_ONLY": (False, False),
    "NEW_IMAGE": (True, False),
    "OLD_IMAGE": (False, True),
    "NEW_AND_OLD_IMAGES": (True, True),
}
TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


@dataclass(frozen=True, slots=True)
class _Change:
    """A write that changed an item, as the stream will show it."""

    old: Item | None
    old_size: int
    new: Item | None
    new_size: int
    sequence: int
    user_identity: dict[str, str] | None


@dataclass
class Index:
    """A global secondary index: which items it holds (those with all its key attributes:
    sparse), in what order, and what of them it projects."""

    name: str
    hash_key: str
    range_key: str | None
    projection_type: str  # ALL, KEYS_ONLY, INCLUDE
    projected: tuple[str, ...]  # KEYS_ONLY / INCLUDE: the attributes it copies
    request: dict[str, Any]  # as created (IndexName, KeySchema, Projection)
    arn: str
    # index partition key's order -> sorted positions: (index sort key's order, table key), or
    # the table key alone for an index without a sort key.
    partitions: dict[Any, list[Any]] = field(default_factory=dict)
    count: int = 0

    def entry(self, item: Item, table_key: TableKey) -> tuple[Any, Any] | None:
        """(partition, position) of ``item`` in this index, ``None`` if it lacks a key."""
        hash_value = item.get(self.hash_key)
        if hash_value is None:
            return None
        if self.range_key is None:
            return order_key(hash_value), table_key
        range_value = item.get(self.range_key)
        if range_value is None:
            return None
        return order_key(hash_value), (order_key(range_value), table_key)

    def move(self, old: tuple[Any, Any] | None, new: tuple[Any, Any] | None) -> None:
        if old == new:
            return
        if old is not None:
            positions = self.partitions[old[0]]
            del positions[bisect.bisect_left(positions, old[1])]
            if not positions:
                del self.partitions[old[0]]
            self.count -= 1
        if new is not None:
            bisect.insort(self.partitions.setdefault(new[0], []), new[1])
            self.count += 1

    def project(self, item: Item) -> Item:
        """What the index holds of ``item`` (shared values: the caller copies)."""
        if self.projection_type == "ALL":
            return item
        return {name: item[name] for name in self.projected if name in item}

    def describe(self, size_bytes: int) -> dict[str, Any]:
        return {
            **self.request,
            "IndexStatus": "ACTIVE",
            "IndexArn": self.arn,
            "ItemCount": self.count,
            "IndexSizeBytes": size_bytes,
            "ProvisionedThroughput": {
                "NumberOfDecreasesToday": 0,
                "ReadCapacityUnits": 0,
                "WriteCapacityUnits": 0,
            },
        }


@dataclass
class Table:
    """One table's schema and contents, and the records of its stream."""

    name: str
    arn: str
    region: str
    hash_key: str
    range_key: str | None
    attribute_types: dict[str, str]  # every key attribute (table's and indexes') -> S, N or B
    request: dict[str, Any]  # CreateTable's KeySchema, AttributeDefinitions, BillingMode
    indexes: dict[str, Index]
    stream_view_type: str | None
    stream_label: str
    ttl_attribute: str | None = None
    items: dict[TableKey, Item] = field(default_factory=dict)
    sizes: dict[TableKey, int] = field(default_factory=dict)
    # partition key's order -> sorted sort keys' orders (tables with a sort key only)
    partitions: dict[Any, list[Any]] = field(default_factory=dict)
    changes: list[_Change] = field(default_factory=list)  # what the stream records
    records: list[dict[str, Any]] = field(default_factory=list)  # those read so far, as records
    _scan_order: list[TableKey] | None = None

    @property
    def key_names(self) -> tuple[str, ...]:
        return (self.hash_key,) if self.range_key is None else (self.hash_key, self.range_key)

    @property
    def stream_arn(self) -> str | None:
        if self.stream_view_type is None:
            return None
        return f"{self.arn}/stream/{self.stream_label}"

    # Keys

    def key_of(self, key: Any) -> TableKey:
        """The table key a request's ``Key`` names: exactly the key attributes, of their types,
        not empty."""
        names = self.key_names
        if type(key) is not dict or len(key) != len(names):
            raise invalid(_BAD_KEY)
        orders = []
        for name in names:
            value = key.get(name)
            if (
                type(value) is not dict
                or len(value) != 1
                or self.attribute_types[name] not in value
            ):
                raise invalid(_BAD_KEY)
            orders.append(self._key_order(name, value))
        return tuple(orders)

    def key_of_item(self, item: Item) -> TableKey:
        """The table key of an item to be written (already imported)."""
        orders = []
        for name in self.key_names:
            value = item.get(name)
            if value is None:
                raise invalid(
                    f"One or more parameter values were invalid: Missing the key {name} in the item"
                )
            expected = self.attribute_types[name]
            if expected not in value:
                raise invalid(
                    "One or more parameter values were invalid: Type mismatch for key "
                    f"{name} expected: {expected} actual: {kind_of(value)}"
                )
            orders.append(self._key_order(name, value))
        return tuple(orders)

    def _key_order(self, name: str, value: dict[str, Any]) -> Any:
        kind = self.attribute_types[name]
        inner = value[kind]
        if kind == "S":
            if type(inner) is not str:
                raise invalid(_BAD_KEY)
            size = text_size(inner)
        elif kind == "B":
            size = len(binary(inner))
        else:
            number(inner)  # a valid number
            size = 0
        if kind != "N" and size == 0:
            raise invalid(
                "One or more parameter values are not valid. The AttributeValue for a key "
                f"attribute cannot contain an empty string value. Key: {name}"
            )
        if name == self.hash_key and size > MAX_PARTITION_KEY_BYTES:
            raise invalid(
                "One or more parameter values were invalid: Size of hashkey has exceeded the "
                f"maximum size limit of{MAX_PARTITION_KEY_BYTES} bytes"
            )
        if name == self.range_key and size > MAX_SORT_KEY_BYTES:
            raise invalid(
                "One or more parameter values were invalid: Aggregated size of all range keys "
                f"has exceeded the size limit of {MAX_SORT_KEY_BYTES} bytes"
            )
        return order_key(value)

    def key_item(self, key: dict[str, Any]) -> Item:
        """The key attributes of a request's (validated) ``Key`` as an item."""
        return {name: import_value(key[name]) for name in self.key_names}

    def key_attributes(self, item: Item, index: Index | None = None) -> Item:
        """``LastEvaluatedKey`` for ``item``: its table key, and the index's key if read
        through an index (copied)."""
        names = self.key_names
        if index is not None:
            names = names + tuple(
                name for name in (index.hash_key, index.range_key) if name and name not in names
            )
        return {name: copy_value(item[name]) for name in names}

    # Writes

    def check_item(self, item: Item, *, updating: bool) -> int:
        """Refuse what DynamoDB refuses in an item about to be stored (index keys of the wrong
        type or empty, more than 400 KB); its size."""
        for index in self.indexes.values():
            for name in (index.hash_key, index.range_key):
                value = item.get(name) if name else None
                if value is None:
                    continue
                expected = self.attribute_types[name]  # type: ignore[index]
                if expected not in value:
                    raise invalid(
                        "One or more parameter values were invalid: Type mismatch for Index Key "
                        f"{name} Expected: {expected} Actual: {kind_of(value)} IndexName: "
                        f"{index.name}"
                    )
                inner = value[expected]
                if expected != "N" and not (inner if expected == "S" else binary(inner)):
                    if updating:
                        raise invalid(
                            "One or more parameter values are not valid. The update expression "
                            "attempted to update a secondary index key to a value that is not "
                            "supported. The AttributeValue for a key attribute cannot contain an "
                            "empty string value."
                        )
                    raise invalid(
                        "One or more parameter values are not valid. A value specified for a "
                        "secondary index key is not supported. The AttributeValue for a key "
                        f"attribute cannot contain an empty string value. IndexName: "
                        f"{index.name}, IndexKey: {name}"
                    )
        size = item_size(item)
        if size > MAX_ITEM_BYTES:
            if updating:
                raise invalid("Item size to update has exceeded the maximum allowed size")
            raise invalid("Item size has exceeded the maximum allowed size")
        return size

    def write(
        self,
        key: TableKey,
        old: Item | None,
        new: Item | None,
        new_size: int = 0,
        *,
        sequence: int = 0,
        user_identity: dict[str, str] | None = None,
    ) -> bool:
        """Store ``new`` at ``key`` (``None``: delete), ``old`` being what was there; keep the
        indexes; record the change on the stream unless the item is unchanged. Whether a
        record was added (the caller counts sequence numbers)."""
        old_size = self.sizes.get(key, 0)
        if new is None:
            if old is None:
                return False
            del self.items[key]
            del self.sizes[key]
            if self.range_key is not None:
                positions = self.partitions[key[0]]
                del positions[bisect.bisect_left(positions, key[1])]
                if not positions:
                    del self.partitions[key[0]]
            self._scan_order = None
        else:
            self.items[key] = new
            self.sizes[key] = new_size
            if old is None:
                if self.range_key is not None:
                    bisect.insort(self.partitions.setdefault(key[0], []), key[1])
                self._scan_order = None
        for index in self.indexes.values():
            index.move(
                index.entry(old, key) if old is not None else None,
                index.entry(new, key) if new is not None else None,
            )
        if self.stream_view_type is None or items_equal(old, new):
            return False
        # Kept as the items themselves (never modified in place): made into records, copies,
        # only when the stream is read, which many tables never are.
        self.changes.append(_Change(old, old_size, new, new_size, sequence, user_identity))
        return True

    def stream_records(self) -> list[dict[str, Any]]:
        """Every record of the stream so far (the model's list: the caller copies it)."""
        for change in self.changes[len(self.records) :]:
            self.records.append(self._record(change))
        return self.records

    def _record(self, change: _Change) -> dict[str, Any]:
        """A change as Lambda's DynamoDB event source delivers it (no creation time: it would
        be the wall clock)."""
        old, old_size, new, new_size = change.old, change.old_size, change.new, change.new_size
        sequence, user_identity = change.sequence, change.user_identity
        some = new if new is not None else old
        keys = {name: copy_value(some[name]) for name in self.key_names}  # type: ignore[index]
        change: dict[str, Any] = {"Keys": keys}
        with_new, with_old = _IMAGES[self.stream_view_type]  # type: ignore[index]
        size = item_size(keys)
        if with_new and new is not None:
            change["NewImage"] = copy_item(new)
            size += new_size
        if with_old and old is not None:
            change["OldImage"] = copy_item(old)
            size += old_size
        change["SequenceNumber"] = f"{sequence:021d}"
        change["SizeBytes"] = size
        change["StreamViewType"] = self.stream_view_type
        record: dict[str, Any] = {
            "eventID": str(len(self.records)),
            "eventName": "INSERT" if old is None else "REMOVE" if new is None else "MODIFY",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": self.region,
            "dynamodb": change,
            "eventSourceARN": self.stream_arn,
        }
        if user_identity is not None:
            record["userIdentity"] = dict(user_identity)
        return record

    # Reads

    def scan_order(self) -> list[TableKey]:
        """Every table key, in scan order (kept until an item is added or deleted)."""
        if self._scan_order is None:
            self._scan_order = sorted(self.items)
        return self._scan_order

    def size_bytes(self) -> int:
        return sum(self.sizes.values())

    # Description

    def describe(self, status: str = "ACTIVE") -> dict[str, Any]:
        described: dict[str, Any] = {
            "TableName": self.name,
            "TableArn": self.arn,
            "TableStatus": status,
            "CreationDateTime": 0.0,
            "KeySchema": [dict(element) for element in self.request["KeySchema"]],
            "AttributeDefinitions": [dict(d) for d in self.request["AttributeDefinitions"]],
            "ItemCount": len(self.items),
            "TableSizeBytes": self.size_bytes(),
            "BillingModeSummary": {"BillingMode": self.request["BillingMode"]},
            "ProvisionedThroughput": {
                "NumberOfDecreasesToday": 0,
                "ReadCapacityUnits": 0,
                "WriteCapacityUnits": 0,
            },
            "DeletionProtectionEnabled": False,
        }
        if self.indexes:
            described["GlobalSecondaryIndexes"] = [
                _copy(index.describe(self._index_size(index))) for index in self.indexes.values()
            ]
        if self.stream_view_type is not None:
            described["StreamSpecification"] = {
                "StreamEnabled": True,
                "StreamViewType": self.stream_view_type,
            }
            described["LatestStreamLabel"] = self.stream_label
            described["LatestStreamArn"] = self.stream_arn
        return described

    def _index_size(self, index: Index) -> int:
        total = 0
        for positions in index.partitions.values():
            for position in positions:
                table_key = position if index.range_key is None else position[1]
                total += item_size(index.project(self.items[table_key]))
        return total


# --- Creation ----------------------------------------------------------------------------------


def new_table(params: dict[str, Any], region: str, account: str, stream_label: str) -> Table:
    """A table as ``CreateTable`` with ``params`` makes it: on-demand or provisioned, global
    secondary indexes, a stream; refused as DynamoDB refuses a malformed definition."""
    name = _required(params, "TableName")
    if type(name) is not str or not 3 <= len(name) <= 255:
        raise invalid("TableName must be between 3 and 255 characters long")
    billing = params.get("BillingMode", "PROVISIONED")
    if billing not in ("PAY_PER_REQUEST", "PROVISIONED"):
        raise invalid(f"BillingMode: {billing} is not PAY_PER_REQUEST or PROVISIONED")
    if billing == "PROVISIONED" and "ProvisionedThroughput" not in params:
        raise invalid(
            "One or more parameter values were invalid: ReadCapacityUnits and "
            "WriteCapacityUnits must both be specified when BillingMode is PROVISIONED"
        )
    if billing == "PAY_PER_REQUEST" and "ProvisionedThroughput" in params:
        raise invalid(
            "One or more parameter values were invalid: Neither ReadCapacityUnits nor "
            "WriteCapacityUnits can be specified when BillingMode is PAY_PER_REQUEST"
        )
    definitions = _required(params, "AttributeDefinitions")
    types: dict[str, str] = {}
    for definition in definitions:
        attribute, kind = definition.get("AttributeName"), definition.get("AttributeType")
        if kind not in ("S", "N", "B"):
            raise invalid(f"Invalid AttributeType {kind} for {attribute}: expected S, N or B")
        if attribute in types:
            raise invalid(f"Duplicate AttributeName in AttributeDefinitions: {attribute}")
        types[attribute] = kind
    hash_key, range_key = _key_schema(_required(params, "KeySchema"), "the table")
    used = {hash_key, range_key}
    arn = f"arn:aws:dynamodb:{region}:{account}:table/{name}"
    indexes: dict[str, Index] = {}
    for request in params.get("GlobalSecondaryIndexes") or []:
        index = _index_of(request, arn, hash_key, range_key)
        if index.name in indexes:
            raise invalid(f"Duplicate index name: {index.name}")
        indexes[index.name] = index
        used |= {index.hash_key, index.range_key}
    used.discard(None)
    undefined = sorted(used - types.keys())  # type: ignore[operator]
    if undefined:
        raise invalid(
            "One or more parameter values were invalid: Some index key attributes are not "
            f"defined in AttributeDefinitions. Keys: [{', '.join(undefined)}], "
            f"AttributeDefinitions: [{', '.join(types)}]"
        )
    if len(used) != len(types):
        raise invalid(
            "One or more parameter values were invalid: Some AttributeDefinitions are not "
            f"used. AttributeDefinitions: [{', '.join(types)}], keys used: "
            f"[{', '.join(sorted(used))}]"  # type: ignore[arg-type]
        )
    stream = params.get("StreamSpecification") or {}
    view_type = stream.get("StreamViewType") if stream.get("StreamEnabled") else None
    if stream.get("StreamEnabled") and view_type not in (
        "KEYS_ONLY",
        "NEW_IMAGE",
        "OLD_IMAGE",
        "NEW_AND_OLD_IMAGES",
    ):
        raise invalid(f"StreamViewType: {view_type} is not a stream view type")
    return Table(
        name=name,
        arn=arn,
        region=region,
        hash_key=hash_key,
        range_key=range_key,
        attribute_types=types,
        request={
            "KeySchema": [dict(element) for element in params["KeySchema"]],
            "AttributeDefinitions": [dict(definition) for definition in definitions],
            "BillingMode": billing,
        },
        indexes=indexes,
        stream_view_type=view_type,
        stream_label=stream_label,
    )


def _key_schema(schema: Any, owner: str) -> tuple[str, str | None]:
    kinds = [element.get("KeyType") for element in schema or ()]
    if kinds not in (["HASH"], ["HASH", "RANGE"]):
        raise invalid(
            f"Invalid KeySchema of {owner}: one HASH element, optionally followed by one RANGE "
            "element"
        )
    names = [element.get("AttributeName") for element in schema]
    return names[0], names[1] if len(names) == 2 else None


def _index_of(
    request: dict[str, Any], table_arn: str, table_hash: str, table_range: str | None
) -> Index:
    unknown = set(request) - {"IndexName", "KeySchema", "Projection", "ProvisionedThroughput"}
    if unknown:
        raise unsupported(f"the GlobalSecondaryIndexes parameter {sorted(unknown)[0]}")
    name = request.get("IndexName")
    if type(name) is not str or not 3 <= len(name) <= 255:
        raise invalid("IndexName must be between 3 and 255 characters long")
    hash_key, range_key = _key_schema(request.get("KeySchema"), f"index {name}")
    projection = request.get("Projection") or {}
    kind = projection.get("ProjectionType")
    extra = projection.get("NonKeyAttributes")
    if kind not in ("ALL", "KEYS_ONLY", "INCLUDE"):
        raise invalid(f"Index {name}: ProjectionType must be ALL, KEYS_ONLY or INCLUDE")
    if (kind == "INCLUDE") != bool(extra):
        raise invalid(
            f"Index {name}: NonKeyAttributes are given with, and only with, ProjectionType INCLUDE"
        )
    keys = [table_hash, table_range, hash_key, range_key]
    projected = tuple(dict.fromkeys(n for n in [*keys, *(extra or ())] if n))
    return Index(
        name=name,
        hash_key=hash_key,
        range_key=range_key,
        projection_type=kind,
        projected=projected,
        request={
            "IndexName": name,
            "KeySchema": [dict(element) for element in request["KeySchema"]],
            "Projection": {
                "ProjectionType": kind,
                **({"NonKeyAttributes": list(extra)} if extra else {}),
            },
        },
        arn=f"{table_arn}/index/{name}",
    )


def _required(params: dict[str, Any], name: str) -> Any:
    value = params.get(name)
    if value is None:
        raise invalid(f"CreateTable: {name} is required")
    return value


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [_copy(inner) for inner in value]
    return value

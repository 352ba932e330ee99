"""The simulations' in-process DynamoDB (:class:`DynamoDBModel`).

Three kinds of evidence: the answers of moto (through :class:`MotoDynamoDB`, which the
simulations used until now) to the same requests, hand-written and randomized; DynamoDB's
documented behaviour where moto departs from it (each such test says which rule); and the
requests DynamoDB refuses, refused with a message naming what is wrong.
"""

from __future__ import annotations

import copy
import random
import re
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError

from streamfleet_dev.assembly import IndexDefinition, TableDefinition
from streamfleet_dev.dsim.attribute_values import number_text
from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel
from streamfleet_dev.dsim.moto_reference import MotoDynamoDB

Step = tuple[str, dict[str, Any]]

THINGS = "things"  # pk (S) / sk (N), three indexes, a stream of both images, TTL on "expires"
SINGLES = "singles"  # pk (S) alone, a stream of new images
THINGS_TABLE: dict[str, Any] = {
    "TableName": THINGS,
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [
        {"AttributeName": name, "AttributeType": kind}
        for name, kind in (("pk", "S"), ("sk", "N"), ("owner", "S"), ("state", "S"), ("kind", "S"))
    ],
    "KeySchema": [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": "by-owner",  # sparse: only items with an owner
            "KeySchema": [
                {"AttributeName": "owner", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["state"]},
        },
        {
            "IndexName": "by-state",  # no sort key
            "KeySchema": [{"AttributeName": "state", "KeyType": "HASH"}],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
        {
            "IndexName": "by-kind",
            "KeySchema": [
                {"AttributeName": "kind", "KeyType": "HASH"},
                {"AttributeName": "pk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        },
    ],
    "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
}
SINGLES_TABLE: dict[str, Any] = {
    "TableName": SINGLES,
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
    "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
}
TTL = {
    "TableName": THINGS,
    "TimeToLiveSpecification": {"Enabled": True, "AttributeName": "expires"},
}


# --- Requests, briefly ----------------------------------------------------------------------


def S(text: str) -> dict[str, str]:
    return {"S": text}


def N(value: Any) -> dict[str, str]:
    return {"N": str(value)}


def key(pk: str, sk: Any) -> dict[str, Any]:
    return {"pk": S(pk), "sk": N(sk)}


def thing(pk: str, sk: Any, **attributes: Any) -> dict[str, Any]:
    return {**key(pk, sk), **attributes}


# The attribute each placeholder stands for; a request gets those its expressions use.
NAMES = {"#pk": "pk", "#sk": "sk", "#owner": "owner", "#state": "state", "#n": "n", "#l": "l"}
PLACEHOLDER = re.compile(r"#\w+")
DERIVED = object()


def request(operation: str, values: dict[str, Any] | None, **params: Any) -> Step:
    """``operation`` with ``params``, ``ExpressionAttributeValues`` if ``values`` is given and,
    unless given (``None``: none at all), the ``ExpressionAttributeNames`` its expressions use."""
    names = params.pop("ExpressionAttributeNames", DERIVED)
    if names is DERIVED:
        text = " ".join(v for k, v in params.items() if k.endswith("Expression"))
        used = sorted(set(PLACEHOLDER.findall(text)))
        names = {placeholder: NAMES[placeholder] for placeholder in used} or None
    if names is not None:
        params["ExpressionAttributeNames"] = names
    if values is not None:
        params["ExpressionAttributeValues"] = values
    return (operation, params)


def put(item: dict[str, Any], values: dict[str, Any] | None = None, **options: Any) -> Step:
    return request("put_item", values, TableName=THINGS, Item=item, **options)


def get(pk: str, sk: Any, **options: Any) -> Step:
    return request("get_item", None, TableName=THINGS, Key=key(pk, sk), **options)


def update(
    pk: str, sk: Any, expression: str, values: dict[str, Any] | None = None, **options: Any
) -> Step:
    return request(
        "update_item", values, TableName=THINGS, Key=key(pk, sk), UpdateExpression=expression,
        **options,
    )  # fmt: skip


def delete(pk: str, sk: Any, values: dict[str, Any] | None = None, **options: Any) -> Step:
    return request("delete_item", values, TableName=THINGS, Key=key(pk, sk), **options)


def query(condition: str, values: dict[str, Any], **options: Any) -> Step:
    return request("query", values, TableName=THINGS, KeyConditionExpression=condition, **options)


def scan(values: dict[str, Any] | None = None, **options: Any) -> Step:
    return request("scan", values, TableName=THINGS, **options)


def pages(step: Step) -> Step:
    """Every page of a query or scan (``Limit`` in its parameters), one after another."""
    return (f"{step[0]}:pages", step[1])


def unordered(step: Step) -> Step:
    """A query's items as a set."""
    return (f"{step[0]}:unordered", step[1])


# --- Running requests on a store, and what may legitimately differ ---------------------------


def new_store(kind: type) -> Any:
    store = kind()
    store.call("create_table", copy.deepcopy(THINGS_TABLE))
    store.call("create_table", copy.deepcopy(SINGLES_TABLE))
    store.call("update_time_to_live", copy.deepcopy(TTL))
    return store


def answer(store: Any, operation: str, params: dict[str, Any]) -> Any:
    """The store's answer, or its error as DynamoDB's code and the item it came with."""
    operation, _, how = operation.partition(":")
    try:
        if how == "pages":
            return all_pages(store, operation, params)
        found = normal(store.call(operation, copy.deepcopy(params)))
        if how == "unordered":
            found["Items"].sort(key=repr)
        return found
    except ClientError as error:
        return {
            "error": error.response["Error"]["Code"],
            "item": normal(error.response.get("Item")),
        }


def all_pages(store: Any, operation: str, params: dict[str, Any]) -> list[Any]:
    """Each page until the last. A page that stops at ``Limit`` names where it stopped whether
    or not anything is left (DynamoDB, and the model); moto names it only when something is
    left. So a last page that is empty and the key that led to it are dropped: what remains is
    the same for both."""
    found: list[Any] = []
    params = copy.deepcopy(params)
    while True:
        page = normal(store.call(operation, copy.deepcopy(params)))
        if not page.get("Items") and "LastEvaluatedKey" not in page and found:
            found[-1].pop("LastEvaluatedKey", None)
            return found
        found.append(page)
        if "LastEvaluatedKey" not in page:
            return found
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# Moto adds these to answers unasked; DynamoDB returns them only when the request asks for them
# (ReturnConsumedCapacity, ReturnItemCollectionMetrics), which no request here does.
UNASKED = ("ConsumedCapacity", "ConsumedCapacityUnits", "ItemCollectionMetrics")


def normal(value: Any) -> Any:
    """``value`` with what legitimately differs made equal: numbers by value (DynamoDB returns
    canonical number text, "2", where moto keeps the text arithmetic gave, "2.0"), set elements
    in one order (DynamoDB's sets are unordered: moto keeps insertion order, the model sorts),
    and the unasked fields above dropped."""
    if isinstance(value, list):
        return [normal(element) for element in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((kind, inner),) = value.items()
        if kind == "N" and isinstance(inner, str):
            return {"N": number_text(Decimal(inner))}
        if kind == "NS" and isinstance(inner, list):
            return {"NS": sorted(number_text(Decimal(n)) for n in inner)}
        if kind in ("SS", "BS") and isinstance(inner, list):
            return {kind: sorted(inner)}
    return {name: normal(inner) for name, inner in value.items() if name not in UNASKED}


def stream(store: Any, table: str) -> list[dict[str, Any]]:
    """The table's stream, without what legitimately differs: ``eventID``, ``SequenceNumber``,
    ``SizeBytes`` (counters and sizes each implementation computes its own way: DynamoDB's are
    opaque), ``eventVersion`` (moto says 1.0, Lambda's event source 1.1), ``eventSourceARN``
    (moto's records lack it). Moto records an item an update created twice (its key alone,
    then the item: moto creates the item before applying the update); DynamoDB records one
    write once, so the first of such a pair is dropped."""
    records = []
    for record in store.stream_records(table)():
        kept = {k: v for k, v in record.items() if k not in ("eventID", "eventVersion")}
        kept.pop("eventSourceARN", None)
        kept["dynamodb"] = normal(
            {
                k: v
                for k, v in record["dynamodb"].items()
                if k not in ("SequenceNumber", "SizeBytes", "ApproximateCreationDateTime")
            }
        )
        records.append(kept)
    kept_records = []
    for at, record in enumerate(records):
        following = records[at + 1] if at + 1 < len(records) else None
        bare_key_first = (
            isinstance(store, MotoDynamoDB)
            and following is not None
            and record["eventName"] == following["eventName"] == "INSERT"
            and record["dynamodb"].get("NewImage") == record["dynamodb"]["Keys"]
            and following["dynamodb"]["Keys"] == record["dynamodb"]["Keys"]
        )
        if not bare_key_first:
            kept_records.append(record)
    return kept_records


def contents(store: Any) -> dict[str, Any]:
    return {
        table: normal(store.call("scan", {"TableName": table}))["Items"]
        for table in (THINGS, SINGLES)
    }


def run(kind: type, steps: list[Step]) -> dict[str, Any]:
    store = new_store(kind)
    try:
        return {
            "answers": [answer(store, operation, params) for operation, params in steps],
            "contents": contents(store),
            "streams": {table: stream(store, table) for table in (THINGS, SINGLES)},
        }
    finally:
        store.close()


# --- 1. The same answers as moto ------------------------------------------------------------

ALICE = thing("p1", 1, owner=S("w1"), state=S("live"), kind=S("conn"), n=N(1), note=S("a"))
BOB = thing("p1", 2, owner=S("w2"), state=S("live"), kind=S("conn"), n=N(2))
CAROL = thing("p1", 10, state=S("ended"), n=N(3), tags={"SS": ["x", "y"]})
DAVE = thing("p2", 1, owner=S("w1"), state=S("live"), kind=S("sess"), n=N(4))
FOUR = [put(ALICE), put(BOB), put(CAROL), put(DAVE)]
ONE, TWO = N(1), N(2)
ABSENT = "attribute_not_exists(#pk)"
PRESENT = "attribute_exists(#pk)"
# Conditions on ALICE (each in an update, its answer the item or the failure with ALL_OLD).
# fmt: off
CONDITIONS: list[tuple[str, dict[str, Any]]] = [
    ("#n = :one", {":one": ONE}),
    ("#n = :one", {":one": N("1.0")}),
    ("#n <> :one", {":one": ONE}),
    ("absent <> :one", {":one": ONE}),
    ("#n < :two AND #n <= :one AND #n > :zero AND #n >= :one",
     {":one": ONE, ":two": TWO, ":zero": N(0)}),
    ("#owner < :w AND #owner >= :v", {":w": S("w2"), ":v": S("w1")}),
    ("#n BETWEEN :zero AND :two", {":zero": N(0), ":two": TWO}),
    ("#n BETWEEN :two AND :three", {":two": TWO, ":three": N(3)}),
    ("#state IN (:a, :b)", {":a": S("ended"), ":b": S("live")}),
    ("#state IN (:a)", {":a": S("ended")}),
    ("#n = :nine OR #state = :live", {":nine": N(9), ":live": S("live")}),
    ("NOT #state = :live", {":live": S("live")}),
    ("NOT (#state = :live AND #n = :nine)", {":live": S("live"), ":nine": N(9)}),
    ("(#n = :nine OR #n = :one) AND #state = :live",
     {":nine": N(9), ":one": ONE, ":live": S("live")}),
    ("#n = :nine OR #n = :one AND #state = :live",
     {":nine": N(9), ":one": ONE, ":live": S("live")}),
    ("attribute_exists(note) AND attribute_not_exists(nothing)", {}),
    ("attribute_type(#n, :t)", {":t": S("N")}),
    ("attribute_type(#n, :t)", {":t": S("S")}),
    ("begins_with(#owner, :w)", {":w": S("w")}),
    ("begins_with(#owner, :w)", {":w": S("x")}),
    ("contains(note, :a)", {":a": S("a")}),
    ("contains(#state, :a)", {":a": S("iv")}),
    ("size(note) = :one", {":one": ONE}),
    ("size(#owner) > :one", {":one": ONE}),
    ("#n = :one and #state = :live", {":one": ONE, ":live": S("live")}),
]
ON_FAILURE = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
OWNER_W1 = ("#owner = :w", {":w": S("w1")})
TOO_MANY_KEYS = ("batch_get_item",
                 {"RequestItems": {THINGS: {"Keys": [key("p", n) for n in range(101)]}}})

SCENARIOS: dict[str, list[Step]] = {
    "put, get, projection, delete": [
        *FOUR,
        get("p1", 1),
        get("p1", 1, ConsistentRead=True, ProjectionExpression="#owner, note"),
        get("p1", 3),
        get("p1", 1, ProjectionExpression="#n"),
        delete("p1", 1, ReturnValues="ALL_OLD"),
        delete("p1", 1, ReturnValues="ALL_OLD"),
        get("p1", 1),
        put(ALICE, ReturnValues="ALL_OLD"),
        put({**ALICE, "n": N(7)}, ReturnValues="ALL_OLD"),
    ],
    "conditional put and delete": [
        put(ALICE, ConditionExpression=ABSENT),
        put(ALICE, ConditionExpression=ABSENT),
        put(ALICE, ConditionExpression=ABSENT, **ON_FAILURE),
        put(BOB, ConditionExpression=PRESENT, **ON_FAILURE),
        delete("p1", 1, {":w": S("w2")}, ConditionExpression="#owner = :w", **ON_FAILURE),
        delete("p1", 1, {":w": S("w1")}, ConditionExpression="#owner = :w", ReturnValues="ALL_OLD"),
        delete("p1", 1, ConditionExpression=PRESENT, **ON_FAILURE),
    ],
    "update clauses in any order": [
        *FOUR,
        update("p1", 1, "SET #state = :s, #n = #n + :one REMOVE note ADD tags :t",
               {":s": S("ended"), ":one": ONE, ":t": {"SS": ["b", "a"]}}, ReturnValues="ALL_NEW"),
        update("p1", 1, "ADD #n :ten DELETE tags :a SET #state = :s",
               {":ten": N(10), ":a": {"SS": ["a"]}, ":s": S("live")}, ReturnValues="ALL_NEW"),
        update("p1", 1, "DELETE tags :b REMOVE #owner", {":b": {"SS": ["b", "zz"]}},
               ReturnValues="ALL_NEW"),
        update("p1", 2, "SET #n = #n - :one, lst = list_append(if_not_exists(lst, :empty), :more)",
               {":one": ONE, ":empty": {"L": []}, ":more": {"L": [S("x"), N(5)]}},
               ReturnValues="ALL_NEW"),
        update("p1", 2, "SET lst = list_append(:front, lst), doc = :doc",
               {":front": {"L": [S("first")]},
                ":doc": {"M": {"a": {"M": {"b": ONE}}, "c": S("d")}}}, ReturnValues="ALL_NEW"),
        update("p1", 2, "SET doc.a.b = :two, doc.e = :two, lst[1] = :two REMOVE doc.c",
               {":two": TWO}, ReturnValues="ALL_NEW"),
        update("p1", 2, "SET fresh = if_not_exists(fresh, :v), #n = if_not_exists(#n, :v)",
               {":v": N(100)}, ReturnValues="ALL_NEW"),
        # Every right-hand side reads the item as it was: b gets the old n.
        update("p1", 2, "SET b = #n, #n = :v", {":v": N(7)}, ReturnValues="ALL_NEW"),
        update("p9", 9, "SET #state = :s ADD #n :one", {":s": S("new"), ":one": ONE},
               ReturnValues="ALL_NEW"),
        update("p9", 8, "ADD nums :ns", {":ns": {"NS": ["3", "1"]}}, ReturnValues="ALL_NEW"),
        update("p9", 8, "ADD nums :ns", {":ns": {"NS": ["2", "3"]}}, ReturnValues="ALL_NEW"),
        update("p9", 8, "DELETE nums :ns", {":ns": {"NS": ["1", "2", "3"]}},
               ReturnValues="ALL_NEW"),
        get("p9", 8),
    ],
    "condition forms": [
        *FOUR,
        *(
            update("p1", 1, "SET hit = :hit", {":hit": S(condition), **values},
                   ConditionExpression=condition, ReturnValues="ALL_NEW", **ON_FAILURE)
            for condition, values in CONDITIONS
        ),
        update("p1", 10, "SET hit = :x", {":x": S("x")}, ConditionExpression="contains(tags, :x)",
               ReturnValues="ALL_NEW"),
        update("p1", 10, "SET hit = :z", {":z": S("z")}, ConditionExpression="contains(tags, :z)"),
        update("p1", 10, "SET hit = :two", {":two": TWO}, ConditionExpression="size(tags) = :two",
               ReturnValues="ALL_NEW"),
    ],
    "return values": [
        *FOUR,
        update("p1", 1, "SET #n = :v", {":v": N(50)}),
        update("p1", 1, "SET #n = :v", {":v": N(51)}, ReturnValues="NONE"),
        update("p1", 1, "SET #n = :v", {":v": N(52)}, ReturnValues="ALL_OLD"),
        update("p1", 1, "SET #n = :v, aside = :o", {":v": N(53), ":o": S("o")},
               ReturnValues="UPDATED_OLD"),
        update("p1", 1, "SET #n = :v REMOVE aside", {":v": N(54)}, ReturnValues="UPDATED_NEW"),
        update("p1", 1, "SET #n = :v", {":v": N(55)}, ReturnValues="ALL_NEW"),
        update("p3", 1, "SET #n = :v", {":v": ONE}, ReturnValues="ALL_OLD"),
        update("p1", 1, "SET #n = :v", {":v": N(56), ":old": N(0)},
               ConditionExpression="#n = :old", ReturnValues="ALL_NEW", **ON_FAILURE),
        update("p4", 1, "SET #n = :v", {":v": ONE}, ConditionExpression="attribute_exists(#n)",
               **ON_FAILURE),
        update("p1", 1, "SET #n = :v", {":v": N(56), ":old": N(0)},
               ConditionExpression="#n = :old", ReturnValuesOnConditionCheckFailure="NONE"),
    ],
    "query: sort key conditions, order, filter, count": [
        *FOUR,
        *(put(thing("q", sk, n=N(sk % 3))) for sk in (-5, 0, 1, 2, 9, 10, 11, 100)),
        *(
            query(condition, {":pk": S("q"), **values})
            for condition, values in [
                ("#pk = :pk", {}),
                ("#pk = :pk AND #sk = :x", {":x": N(10)}),
                ("#pk = :pk AND #sk = :x", {":x": N("10.0")}),
                ("#pk = :pk AND #sk < :x", {":x": N(10)}),
                ("#pk = :pk AND #sk <= :x", {":x": N(10)}),
                ("#pk = :pk AND #sk > :x", {":x": N(9)}),
                ("#pk = :pk AND #sk >= :x", {":x": N(9)}),
                ("#pk = :pk AND #sk BETWEEN :x AND :y", {":x": N(0), ":y": N(10)}),
                ("#sk > :x AND #pk = :pk", {":x": ONE}),
                ("#pk = :pk AND #sk > :x", {":x": N(1000)}),
            ]
        ),
        query("#pk = :pk", {":pk": S("q")}, ScanIndexForward=False),
        query("#pk = :pk AND #sk > :x", {":pk": S("q"), ":x": N(0)}, ScanIndexForward=False,
              Limit=3),
        query("pk = :pk", {":pk": S("q"), ":one": ONE}, FilterExpression="#n = :one"),
        query("pk = :pk", {":pk": S("q"), ":one": ONE}, FilterExpression="#n = :one", Limit=4),
        query("pk = :pk", {":pk": S("q")}, Select="COUNT"),
        query("pk = :pk", {":pk": S("q"), ":one": ONE}, FilterExpression="#n = :one",
              Select="COUNT"),
        query("pk = :pk", {":pk": S("q")}, ProjectionExpression="#sk"),
        query("pk = :pk", {":pk": S("nothing")}),
    ],
    "query and scan paging with Limit": [
        *FOUR,
        *(put(thing("q", sk, n=N(sk % 3), owner=S("w1"))) for sk in range(7)),
        *(
            pages(query("pk = :pk", {":pk": S("q")}, Limit=limit, ScanIndexForward=forward))
            for limit in (1, 2, 3, 7, 8)
            for forward in (True, False)
        ),
        pages(query("pk = :pk", {":pk": S("q"), ":zero": N(0)}, FilterExpression="#n = :zero",
                    Limit=2)),
        *(pages(scan(Limit=limit)) for limit in (1, 3, 5)),
        pages(scan({":w": S("w1")}, Limit=2, FilterExpression="#owner = :w")),
        scan(Select="COUNT"),
        scan(ProjectionExpression="pk, sk, #n"),
    ],
    "indexes: sparse, projections, paging": [
        *FOUR,
        *(put(thing("r", sk, owner=S("w1"), state=S("live"), extra=N(sk))) for sk in range(5)),
        *(
            pages(query(condition, values, IndexName=index, Limit=limit))
            for index, condition, values in [
                ("by-owner", *OWNER_W1),
                ("by-owner", "#owner = :w AND #sk > :x", {":w": S("w1"), ":x": ONE}),
                ("by-kind", "kind = :k", {":k": S("conn")}),
                ("by-kind", "kind = :k AND begins_with(pk, :p)", {":k": S("sess"), ":p": S("p")}),
            ]
            for limit in (2, 100)
        ),
        query(*OWNER_W1, IndexName="by-owner", ConsistentRead=True),
        query(*OWNER_W1, IndexName="by-owner", ScanIndexForward=False),
        query("#owner = :w", {":w": S("w1"), ":s": S("live")}, IndexName="by-owner",
              FilterExpression="#state = :s"),
        update("r", 0, "REMOVE #owner"),
        update("r", 1, "SET #owner = :w", {":w": S("w2")}),
        query("#owner = :w", {":w": S("w2")}, IndexName="by-owner"),
        delete("r", 2),
        query(*OWNER_W1, IndexName="by-owner"),
        pages(scan(IndexName="by-owner", Limit=2)),
        # An index without a sort key: DynamoDB leaves the order of its items unspecified (moto
        # orders them by the table's sort key, the model by the table's key), so as a set.
        *(
            unordered(query("#state = :s", {":s": S(state)}, IndexName="by-state"))
            for state in ("live", "ended", "none")
        ),
    ],
    "batches": [
        ("batch_write_item", {"RequestItems": {
            THINGS: [{"PutRequest": {"Item": item}} for item in (ALICE, BOB, CAROL)],
            SINGLES: [{"PutRequest": {"Item": {"pk": S("one"), "v": ONE}}}],
        }}),
        ("batch_get_item", {"RequestItems": {
            THINGS: {"Keys": [key("p1", 1), key("p1", 2), key("p7", 7)], "ConsistentRead": True},
            SINGLES: {"Keys": [{"pk": S("one")}], "ProjectionExpression": "v"},
        }}),
        ("batch_write_item", {"RequestItems": {THINGS: [
            {"DeleteRequest": {"Key": key("p1", 1)}}, {"DeleteRequest": {"Key": key("p7", 7)}},
        ]}}),
        ("batch_get_item", {"RequestItems": {THINGS: {"Keys": [key("p1", 1), key("p1", 2)]}}}),
        ("batch_write_item", {"RequestItems": {THINGS: [{"PutRequest": {"Item": ALICE}}] * 2}}),
        ("batch_get_item", {"RequestItems": {THINGS: {"Keys": [key("p1", 1)] * 2}}}),
        TOO_MANY_KEYS,
    ],
    "stream: what is recorded": [
        put(ALICE),
        put(ALICE),  # unchanged: no record
        update("p1", 1, "SET note = :a", {":a": S("a")}),  # unchanged
        update("p1", 1, "SET note = :b", {":b": S("b")}),
        update("p1", 1, "ADD tags :t", {":t": {"SS": ["b", "a"]}}),
        update("p1", 1, "ADD tags :t", {":t": {"SS": ["a"]}}),  # unchanged
        update("p1", 1, "SET note = :c", {":a": S("a"), ":c": S("c")},
               ConditionExpression="note = :a"),  # failed: no record
        delete("p1", 1),
        delete("p1", 1),  # nothing to delete: no record
        ("put_item", {"TableName": SINGLES, "Item": {"pk": S("one"), "v": ONE}}),
        ("put_item", {"TableName": SINGLES, "Item": {"pk": S("one"), "v": TWO}}),
        ("delete_item", {"TableName": SINGLES, "Key": {"pk": S("one")}}),
    ],
    "refusals moto shares": [
        *FOUR,
        ("get_item", {"TableName": THINGS, "Key": {"pk": S("p1")}}),
        ("get_item", {"TableName": THINGS, "Key": {**key("p1", 1), "x": S("y")}}),
        ("get_item", {"TableName": THINGS, "Key": {"pk": S(""), "sk": ONE}}),
        ("get_item", {"TableName": "nowhere", "Key": key("p1", 1)}),
        put({"pk": S("p1"), "n": ONE}),
        put({"sk": ONE, "n": ONE}),
        put(thing("p1", 5, owner=S(""))),
        update("p1", 1, "SET pk = :v", {":v": S("x")}),
        update("p1", 1, "SET a = :v, a = :v", {":v": S("x")}),
        update("p1", 1, "SET a = :v", {":v": S("x"), ":unused": S("y")}),
        update("p1", 1, "SET a = :v", {}),
        update("p1", 1, "SET a = :v"),
        update("p1", 1, "SET a = :v", {":v": S("x")}, ConditionExpression="((a = :v))"),
        query(*OWNER_W1, IndexName="by-owner", ConsistentRead=True),
        TOO_MANY_KEYS,
    ],
}
# fmt: on
# Refusals a scenario means to make (its other steps must be accepted: a refusal both give for
# a mistake in the test itself would otherwise pass unnoticed).
MEANT_REFUSALS = {
    "indexes: sparse, projections, paging": 1,  # a consistent read of an index
    "batches": 3,  # a key twice, in a write and in a read; too many keys
    "refusals moto shares": 14,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_model_answers_as_moto_does(name: str) -> None:
    steps = SCENARIOS[name]
    ours, moto = run(DynamoDBModel, steps), run(MotoDynamoDB, steps)
    for at, (mine, theirs) in enumerate(zip(ours["answers"], moto["answers"], strict=True)):
        assert mine == theirs, f"step {at}: {steps[at]}"
    assert ours["contents"] == moto["contents"]
    assert ours["streams"] == moto["streams"]
    errors = [a.get("error") for a in ours["answers"] if isinstance(a, dict)]
    assert errors.count("ValidationException") == MEANT_REFUSALS.get(name, 0)


def test_tables_are_described_as_moto_describes_them() -> None:
    ours, moto = new_store(DynamoDBModel), new_store(MotoDynamoDB)

    def shape(store: Any) -> dict[str, Any]:
        store.call("put_item", {"TableName": THINGS, "Item": ALICE})
        table = store.call("describe_table", {"TableName": THINGS})["Table"]
        return {
            "status": table["TableStatus"],
            "name": table["TableName"],
            "keys": table["KeySchema"],
            "attributes": sorted(a["AttributeName"] for a in table["AttributeDefinitions"]),
            "indexes": sorted(
                (i["IndexName"], str(i["KeySchema"]), str(i["Projection"]), i["IndexStatus"])
                for i in table["GlobalSecondaryIndexes"]
            ),
            "stream": table["StreamSpecification"],
            "has stream arn": "LatestStreamArn" in table,
            "billing": table["BillingModeSummary"]["BillingMode"],
            "ttl": store.call("describe_time_to_live", {"TableName": THINGS}),
            # ListTables documents no order: moto lists by creation, the model by name.
            "tables": sorted(store.call("list_tables", {})["TableNames"]),
        }

    assert shape(ours) == shape(moto)
    for store in (ours, moto):
        store.call("delete_table", {"TableName": SINGLES})
        assert store.call("list_tables", {})["TableNames"] == [THINGS]
        with pytest.raises(ClientError) as refused:
            store.call("describe_table", {"TableName": SINGLES})
        assert refused.value.response["Error"]["Code"] == "ResourceNotFoundException"


# --- 2. Randomized: the same answers and contents over a few thousand operations ------------


def random_step(rng: random.Random) -> Step:
    """A conditional write or a read of a small key space, so that conditions both hold and
    fail, items move in and out of the sparse index, and queries page."""
    pk, sk = rng.choice(["p0", "p1", "p2"]), rng.randrange(6)
    owner, state = S(rng.choice(["w0", "w1", "w2"])), S(rng.choice("AB"))
    roll = rng.random()
    if roll < 0.25:
        item = thing(pk, sk, n=N(rng.randrange(4)), state=state)
        if rng.random() < 0.6:
            item["owner"] = owner
        options: dict[str, Any] = {
            "ReturnValues": rng.choice(["NONE", "ALL_OLD"]),
            "ReturnValuesOnConditionCheckFailure": rng.choice(["NONE", "ALL_OLD"]),
        }
        condition = rng.choice([None, ABSENT, "attribute_not_exists(#n) OR #n < :n"])
        if condition is None:
            return put(item, **options)
        values = {":n": N(rng.randrange(4))} if ":n" in condition else None
        return put(item, values, ConditionExpression=condition, **options)
    if roll < 0.5:
        actions, values = ["ADD #n :one"], {":one": ONE}
        change = rng.choice(["set", "remove", None])
        if change == "set":
            actions.append("SET #owner = :w, #state = :s")
            values.update({":w": owner, ":s": state})
        elif change == "remove":
            actions.append("REMOVE #owner")
        rng.shuffle(actions)
        options = {"ReturnValues": rng.choice(["NONE", "ALL_OLD", "ALL_NEW"])}
        condition = rng.choice([None, PRESENT, "#n < :limit", "owned"])
        if condition == "owned":
            condition = f"{PRESENT} AND (#owner = :me OR attribute_not_exists(#owner))"
            values[":me"] = S(rng.choice(["w0", "w1", "w2"]))
        elif condition == "#n < :limit":
            values[":limit"] = N(rng.randrange(1, 6))
        if condition is not None:
            options["ConditionExpression"] = condition
            options["ReturnValuesOnConditionCheckFailure"] = rng.choice(["NONE", "ALL_OLD"])
        return update(pk, sk, " ".join(actions), values, **options)
    if roll < 0.6:
        options = {"ReturnValues": rng.choice(["NONE", "ALL_OLD"])}
        if rng.random() < 0.5:
            options.update(ConditionExpression="#owner = :w", **ON_FAILURE)
            return delete(pk, sk, {":w": owner}, **options)
        return delete(pk, sk, **options)
    if roll < 0.8:
        operator = rng.choice(["", "=", "<", "<=", ">", ">=", "BETWEEN"])
        condition, values = "#pk = :pk", {":pk": S(pk)}
        if operator == "BETWEEN":
            low = rng.randrange(6)
            condition += " AND #sk BETWEEN :x AND :y"
            values.update({":x": N(low), ":y": N(low + rng.randrange(3))})
        elif operator:
            condition += f" AND #sk {operator} :x"
            values[":x"] = N(rng.randrange(6))
        options = {"ScanIndexForward": rng.random() < 0.5, "ConsistentRead": True}
        if rng.random() < 0.6:
            options["Limit"] = rng.randrange(1, 4)
        if rng.random() < 0.3:
            options["FilterExpression"] = "#state = :s"
            values[":s"] = state
        return query(condition, values, **options)
    if roll < 0.9:
        options = {"IndexName": "by-owner", "ScanIndexForward": rng.random() < 0.5}
        if rng.random() < 0.6:
            options["Limit"] = rng.randrange(1, 4)
        return query("#owner = :w", {":w": owner}, **options)
    return get(pk, sk, ConsistentRead=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_give_moto_s_answers_and_contents(seed: int) -> None:
    rng = random.Random(seed)
    ours, moto = new_store(DynamoDBModel), new_store(MotoDynamoDB)
    for at in range(1000):
        operation, params = random_step(rng)
        mine, theirs = answer(ours, operation, params), answer(moto, operation, params)
        if "LastEvaluatedKey" in mine and "LastEvaluatedKey" not in theirs:
            # Stopped at Limit with nothing left: DynamoDB (and the model) still say where
            # (test_a_page_that_stops_at_limit_names_where_even_if_nothing_is_left).
            rest = ours.call(operation, {**params, "ExclusiveStartKey": mine["LastEvaluatedKey"]})
            assert rest["Count"] == rest["ScannedCount"] == 0 and "LastEvaluatedKey" not in rest
            del mine["LastEvaluatedKey"]
        assert mine == theirs, f"step {at}: {operation} {params}"
    assert contents(ours) == contents(moto)
    assert stream(ours, THINGS) == stream(moto, THINGS)


# --- Where moto departs from DynamoDB: DynamoDB's documented behaviour ----------------------


def model() -> DynamoDBModel:
    return new_store(DynamoDBModel)


def refusal(store: Any, operation: str, params: dict[str, Any]) -> ClientError:
    with pytest.raises(ClientError) as refused:
        store.call(operation, params)
    return refused.value


def test_a_page_that_stops_at_limit_names_where_even_if_nothing_is_left() -> None:
    # Query, Limit: "If DynamoDB processes the number of items up to the limit while processing
    # the results, it stops the operation and returns the matching values up to that point, and
    # a key in LastEvaluatedKey to apply in a subsequent operation". Moto names it only when an
    # item is left; a client must be ready for an empty last page.
    store = model()
    for sk in (1, 2):
        store.call(*put(thing("q", sk)))
    _, params = query("pk = :p", {":p": S("q")}, Limit=2)
    first = store.call("query", params)
    assert first["Count"] == 2 and first["LastEvaluatedKey"] == key("q", 2)
    rest = store.call("query", {**params, "ExclusiveStartKey": first["LastEvaluatedKey"]})
    assert rest == {"Items": [], "Count": 0, "ScannedCount": 0}


def test_numbers_an_update_computes_come_back_in_canonical_form() -> None:
    # "Numbers ... Leading and trailing zeroes are trimmed" (Developer Guide, supported data
    # types): 1 + 1.0 is 2 and ADD 1.50 gives 1.5. Moto keeps the text its arithmetic gave
    # ("2.0", "1.50").
    store = model()
    store.call(*put(thing("p", 1, n=ONE)))
    values = {":x": N("1.0"), ":y": N("1.50")}
    changed = store.call(
        *update("p", 1, "SET #n = #n + :x ADD m :y", values, ReturnValues="ALL_NEW")
    )
    assert changed["Attributes"]["n"] == TWO and changed["Attributes"]["m"] == N("1.5")


def test_an_update_that_creates_an_item_is_one_insert_record() -> None:
    # DynamoDB Streams: "each stream record appears exactly once in the stream", one per
    # modification. Moto records an item an update created twice (its bare key, then the item).
    store = model()
    store.call(*update("p", 1, "SET #n = :one", {":one": ONE}))
    (record,) = store.stream_records(THINGS)()
    assert record["eventName"] == "INSERT"
    assert record["dynamodb"]["NewImage"] == thing("p", 1, n=ONE)


def test_a_write_that_changes_no_data_is_not_recorded_even_in_other_number_text() -> None:
    # "If you perform a PutItem or UpdateItem operation that does not change any data in an
    # item, DynamoDB Streams does not write a stream record for that operation", and 1.0 is the
    # number 1 (DynamoDB stores numbers canonically). MotoDynamoDB compares the text.
    store = model()
    store.call(*put(thing("p", 1, n=ONE, s={"SS": ["a", "b"]})))
    store.call(*put(thing("p", 1, n=N("1.0"), s={"SS": ["b", "a"]})))
    assert [r["eventName"] for r in store.stream_records(THINGS)()] == ["INSERT"]


@pytest.mark.parametrize(
    "step",
    [
        put(ALICE, {":x": ONE}, ConditionExpression="attribute_not_exists(pk)"),
        delete("p1", 1, {":x": ONE}, ConditionExpression="attribute_exists(pk)"),
        query("pk = :p", {":p": S("p1"), ":x": ONE}),
        scan({":n": ONE, ":x": ONE}, FilterExpression="n = :n"),
    ],
)
def test_a_value_no_expression_uses_is_refused_by_every_operation(step: Step) -> None:
    # DynamoDB answers "Value provided in ExpressionAttributeValues unused in expressions" for
    # any request, as moto does only for UpdateItem.
    error = refusal(model(), *step)
    assert error.response["Error"]["Code"] == "ValidationException"
    assert "ExpressionAttributeValues unused in expressions: keys: {:x}" in str(error)


def test_a_query_filter_may_not_name_a_key_attribute() -> None:
    # Query, FilterExpression: "A FilterExpression does not allow key attributes. You cannot
    # define a filter expression based on a partition key or a sort key." Moto filters on it.
    error = refusal(
        model(), *query("pk = :p", {":p": S("p"), ":x": ONE}, FilterExpression="sk > :x")
    )
    assert "Filter Expression can only contain non-primary key attributes" in str(error)
    assert "Primary key attribute: sk" in str(error)


def test_updated_old_and_new_are_the_attributes_the_update_names() -> None:
    # UpdateItem, ReturnValues: "UPDATED_OLD - Returns only the updated attributes, as they
    # appeared before the UpdateItem operation" (UPDATED_NEW: as they appear after): the
    # attributes the update expression acts on, whether or not their value changed, and not
    # the key. Moto returns only the attributes whose value changed, and the key of an item
    # the update created.
    store = model()
    store.call(*put(thing("p", 1, n=ONE, m={"M": {"a": ONE}})))
    _, params = update("p", 1, "SET #n = :one, m.b = :one", {":one": ONE})
    old = store.call("update_item", {**params, "ReturnValues": "UPDATED_OLD"})
    assert old == {"Attributes": {"n": ONE}}  # m.b was not there before
    new = store.call("update_item", {**params, "ReturnValues": "UPDATED_NEW"})
    assert new == {"Attributes": {"n": ONE, "m": {"M": {"b": ONE}}}}
    created = store.call(
        *update("p", 2, "SET #n = :one", {":one": ONE}, ReturnValues="UPDATED_NEW")
    )
    assert created == {"Attributes": {"n": ONE}}


def test_index_keys_of_the_wrong_type_or_empty_are_refused() -> None:
    # An index key attribute holds its AttributeDefinitions type, and "String and Binary type
    # attributes ... can have length zero if the attribute is not used as a key for an index or
    # table" (Developer Guide, supported data types). Moto stores both.
    store = model()
    wrong = refusal(store, *put(thing("p", 1, owner=ONE)))
    assert "Type mismatch for Index Key owner Expected: S Actual: N IndexName: by-owner" in str(
        wrong
    )
    store.call(*put(thing("p", 1, owner=S("w"))))
    empty = refusal(store, *update("p", 1, "SET #owner = :e", {":e": S("")}))
    assert "secondary index key" in str(empty)


@pytest.mark.parametrize(
    "condition", ["#n < :text", "#n = :text", "#n >= :text", "size(#n) > :text"]
)
def test_values_of_different_types_compare_as_not_matching(condition: str) -> None:
    # "If an item contains an AttributeValue element of a different type than the one provided
    # in the request, the value does not match. For example, {"S":"6"} does not equal
    # {"N":"6"}" (Condition, ComparisonOperator); ordering likewise, and a number has no size.
    # Moto fails with an internal error on "#n < :text" and on "size(#n)".
    store = model()
    store.call(*put(thing("p", 1, n=N(6))))
    step = update("p", 1, "SET hit = :text", {":text": S("6")}, ConditionExpression=condition)
    assert refusal(store, *step).response["Error"]["Code"] == "ConditionalCheckFailedException"
    store.call(
        *update("p", 1, "SET hit = :text", {":text": S("6")}, ConditionExpression="#n <> :text")
    )


def test_a_key_of_the_wrong_type_is_refused_on_a_read() -> None:
    # GetItem: "The provided key element does not match the schema" for a key of the wrong
    # type, as for a write; moto answers as if the item did not exist.
    error = refusal(model(), "get_item", {"TableName": THINGS, "Key": {"pk": S("p"), "sk": S("1")}})
    assert "The provided key element does not match the schema" in str(error)


def test_an_unknown_index_is_a_validation_error() -> None:
    # DynamoDB: ValidationException "The table does not have the specified index"; moto
    # answers ResourceNotFoundException.
    error = refusal(model(), *query("pk = :p", {":p": S("p")}, IndexName="nope"))
    assert error.response["Error"]["Code"] == "ValidationException"
    assert "does not have the specified index: nope" in str(error)


def test_a_projection_names_list_elements_through_placeholders() -> None:
    # Projection expressions take document paths, placeholders and list indexes included
    # ("#pr.FiveStar", "RelatedItems[0]"); moto counts "#l" in "#l[1]" as unused.
    store = model()
    store.call(
        *put(thing("p", 1, l={"L": [S("a"), S("b"), S("c")]}, m={"M": {"x": ONE, "y": TWO}}))
    )
    got = store.call(*get("p", 1, ProjectionExpression="#l[2], #l[0], m.y"))
    assert got == {"Item": {"l": {"L": [S("a"), S("c")]}, "m": {"M": {"y": TWO}}}}


# --- 3. Strict: what DynamoDB refuses, refused and named --------------------------------------

BIG = S("x" * (400 * 1024))
NO_NAMES: dict[str, Any] = {"ExpressionAttributeNames": None}  # placeholders left undefined
# fmt: off
STRICT: dict[str, tuple[Step, list[str]]] = {
    "an unused value": (
        update("p1", 1, "SET a = :v", {":v": ONE, ":w": TWO}),
        ["ExpressionAttributeValues unused", ":w"]),
    "an unused name": (
        update("p1", 1, "SET a = :v", {":v": ONE}, ExpressionAttributeNames={"#b": "b"}),
        ["ExpressionAttributeNames unused", "#b"]),
    "an undefined value": (
        update("p1", 1, "SET a = :v, b = :w", {":v": ONE}), ["UpdateExpression", "value", ":w"]),
    "an undefined name": (
        put(ALICE, ConditionExpression="attribute_not_exists(#k)", **NO_NAMES),
        ["ConditionExpression", "attribute name", "#k"]),
    "empty values": (
        update("p1", 1, "SET a = b", {}), ["ExpressionAttributeValues must not be empty"]),
    "names without an expression": (
        get("p1", 1, ExpressionAttributeNames={"#a": "a"}),
        ["ExpressionAttributeNames can only be specified when using expressions"]),
    "an empty table key": (
        put(thing("", 1)), ["cannot contain an empty string value", "Key: pk"]),
    "an empty index key": (
        put(thing("p", 1, kind=S(""))), ["IndexName: by-kind", "IndexKey: kind"]),
    "a key of the wrong type": (
        ("get_item", {"TableName": THINGS, "Key": {"pk": S("p"), "sk": S("1")}}),
        ["The provided key element does not match the schema"]),
    "an item key of the wrong type": (
        put({"pk": S("p"), "sk": S("1")}), ["Type mismatch for key sk expected: N actual: S"]),
    "an index key of the wrong type": (
        put(thing("p", 1, state=ONE)), ["Type mismatch for Index Key state", "by-state"]),
    "a key missing an attribute": (
        ("delete_item", {"TableName": THINGS, "Key": {"pk": S("p")}}),
        ["The provided key element does not match the schema"]),
    "a key with an extra attribute": (
        ("get_item", {"TableName": THINGS, "Key": {**key("p", 1), "n": ONE}}),
        ["The provided key element does not match the schema"]),
    "an item missing a key attribute": (put({"pk": S("p")}), ["Missing the key sk in the item"]),
    "an item over 400 KB": (put(thing("p", 1, big=BIG)), ["Item size has exceeded"]),
    "an update to over 400 KB": (
        update("p1", 1, "SET big = :b", {":b": BIG}), ["Item size to update has exceeded"]),
    "an update of a key attribute": (
        update("p1", 1, "SET #sk = :v", {":v": TWO}),
        ["Cannot update attribute sk", "part of the key"]),
    "two clauses on one path": (
        update("p1", 1, "SET a = :v REMOVE a", {":v": ONE}),
        ["Two document paths overlap", "[a]"]),
    "a path inside another": (
        update("p1", 1, "SET m = :v REMOVE m.x", {":v": ONE}), ["paths overlap", "[m, x]"]),
    "a clause twice": (
        update("p1", 1, "SET a = :v SET b = :v", {":v": ONE}),
        ['The "SET" section can only be used once']),
    "redundant parentheses": (
        put(ALICE, ConditionExpression="((attribute_not_exists(pk)))"),
        ["ConditionExpression", "redundant parentheses"]),
    "a reserved word": (
        put(ALICE, ConditionExpression="attribute_not_exists(status)"),
        ["reserved keyword: status"]),
    "a syntax error": (
        put(ALICE, ConditionExpression="attribute_not_exists(pk) AND"),
        ["ConditionExpression", "Syntax error", "<EOF>"]),
    "an unknown function": (
        put(ALICE, ConditionExpression="exists(pk)"), ["Invalid function name; function: exists"]),
    "a number prefix": (
        put(ALICE, {":n": ONE}, ConditionExpression="begins_with(note, :n)"),
        ["begins_with", "NUMBER"]),
    "an unknown type name": (
        put(ALICE, {":t": S("STRING")}, ConditionExpression="attribute_type(note, :t)"),
        ["Invalid attribute type name found in type: STRING"]),
    "IN with over 100 operands": (
        put(ALICE, {f":v{n}": N(n) for n in range(101)},
            ConditionExpression="note IN (" + ", ".join(f":v{n}" for n in range(101)) + ")"),
        ["IN operator", "too many operands"]),
    "a consistent read of an index": (
        query(*OWNER_W1, IndexName="by-owner", ConsistentRead=True),
        ["Consistent reads are not supported on global secondary indexes"]),
    "an unknown index": (
        query("pk = :p", {":p": S("p")}, IndexName="nope"),
        ["The table does not have the specified index: nope"]),
    "a query without the partition key": (
        query("sk = :s", {":s": ONE}), ["Query condition missed key schema element: pk"]),
    "a query with OR": (
        query("pk = :p OR pk = :q", {":p": S("p"), ":q": S("q")}),
        ["Invalid operator used in KeyConditionExpression: OR"]),
    "a query on a non-key attribute": (
        query("pk = :p AND n = :n", {":p": S("p"), ":n": ONE}),
        ["Query key condition not supported"]),
    "a query value of the wrong type": (
        query("pk = :p AND sk > :s", {":p": S("p"), ":s": S("1")}),
        ["Condition parameter type does not match schema type"]),
    "BETWEEN reversed": (
        query("pk = :p AND sk BETWEEN :a AND :b", {":p": S("p"), ":a": N(5), ":b": ONE}),
        ["BETWEEN operator requires upper bound to be greater than or equal to lower bound"]),
    "begins_with on a number key": (
        query("pk = :p AND begins_with(sk, :s)", {":p": S("p"), ":s": ONE}),
        ["begins_with", "NUMBER"]),
    "a limit of 0": (
        query("pk = :p", {":p": S("p")}, Limit=0), ["'limit'", "greater than or equal to 1"]),
    "a starting key of another shape": (
        query("pk = :p", {":p": S("p")}, ExclusiveStartKey={"pk": S("p")}),
        ["The provided starting key is invalid"]),
    "too many keys to get": (TOO_MANY_KEYS, ["Too many items requested for the BatchGetItem call"]),
    "too many writes": (
        ("batch_write_item", {"RequestItems": {THINGS: [
            {"PutRequest": {"Item": thing("p", n)}} for n in range(26)]}}),
        ["requestItems", "less than or equal to 25"]),
    "a batch writing a key twice": (
        ("batch_write_item", {"RequestItems": {THINGS: [
            {"PutRequest": {"Item": ALICE}}, {"DeleteRequest": {"Key": key("p1", 1)}}]}}),
        ["Provided list of item keys contains duplicates"]),
    "not a number": (put(thing("p", 1, n=N("1_000"))), ["cannot be converted into a number"]),
    "39 digits": (put(thing("p", 1, n=N("1" * 39))), ["38 significant digits"]),
    "an empty set": (put(thing("p", 1, s={"SS": []})), ["string set  may not be empty"]),
    "a set with duplicates": (put(thing("p", 1, s={"NS": ["1", "1.0"]})), ["contains duplicates"]),
    "ADD of a string": (
        update("p1", 1, "ADD note :s", {":s": S("x")}), ["operator: ADD, operand type: STRING"]),
    "DELETE of a number": (
        update("p1", 1, "DELETE n :s", {":s": ONE}), ["operator: DELETE, operand type: NUMBER"]),
    "ADD to a string": (
        update("p1", 1, "ADD note :one", {":one": ONE}),
        ["An operand in the update expression has an incorrect data type"]),
    "arithmetic on nothing": (
        update("p1", 1, "SET a = nothing + :one", {":one": ONE}),
        ["refers to an attribute that does not exist in the item"]),
    "ALL_NEW on a put": (put(ALICE, ReturnValues="ALL_NEW"), ["ReturnValues", "ALL_NEW"]),
    "a legacy parameter": (
        put(ALICE, Expected={"pk": {"Exists": False}}), ["legacy parameter Expected"]),
    "consumed capacity": (
        get("p1", 1, ReturnConsumedCapacity="TOTAL"), ["ReturnConsumedCapacity"]),
    "a parallel scan": (scan(Segment=0, TotalSegments=2), ["Segment"]),
    "all attributes of a keys-only index": (
        query("#state = :s", {":s": S("live")}, IndexName="by-state", Select="ALL_ATTRIBUTES"),
        ["ALL_ATTRIBUTES", "by-state"]),
}
# fmt: on


@pytest.mark.parametrize("name", list(STRICT))
def test_what_dynamodb_refuses_is_refused_by_name(name: str) -> None:
    (operation, params), fragments = STRICT[name]
    store = model()
    store.call(*put(ALICE))
    error = refusal(store, operation, params)
    assert error.response["Error"]["Code"] == "ValidationException"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error.operation_name == "".join(part.capitalize() for part in operation.split("_"))
    for fragment in fragments:
        assert fragment in error.response["Error"]["Message"]
    assert store.call(*get("p1", 1))["Item"] == ALICE  # nothing written


def test_other_refusals_carry_dynamodb_s_codes() -> None:
    store = model()
    missing = refusal(store, "get_item", {"TableName": "nowhere", "Key": key("p", 1)})
    assert missing.response["Error"]["Code"] == "ResourceNotFoundException"
    again = refusal(store, "create_table", copy.deepcopy(THINGS_TABLE))
    assert again.response["Error"]["Code"] == "ResourceInUseException"
    unknown = refusal(store, "transact_write_items", {"TransactItems": []})
    assert unknown.response["Error"]["Code"] == "UnknownOperationException"
    assert "TransactWriteItems" in unknown.response["Error"]["Message"]
    with pytest.raises(ClientError):
        store.transact_get_items(TransactItems=[])
    failed = refusal(store, *put(ALICE, ConditionExpression=PRESENT, **ON_FAILURE))
    assert failed.response["Error"] == {
        "Code": "ConditionalCheckFailedException",
        "Message": "The conditional request failed",
    }
    assert "Item" not in failed.response  # there was no item to return
    store.call(*put(ALICE))
    failed = refusal(store, *put(ALICE, ConditionExpression=ABSENT, **ON_FAILURE))
    assert failed.response["Item"] == ALICE


# --- The model's own promises: order, streams, TTL, copies, interface, speed ------------------


def sorted_table(name: str, sort_type: str) -> dict[str, Any]:
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": sort_type},
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    }


@pytest.mark.parametrize(
    "sort_type, sort_keys",
    [
        ("N", ["-10", "-1.5", "0", "2", "9", "10", "10.5", "100", "1E+3"]),
        # Code point order, which is UTF-8 byte order: upper case before lower, ASCII before é.
        ("S", ["A", "B", "Z", "a", "aa", "b", "z", "é", "你"]),
        ("B", [b"\x00", b"\x00\x01", b"\x01", b"\x7f", b"\x80", b"\xff"]),
    ],
)
def test_a_partition_is_in_dynamodb_s_sort_key_order(sort_type: str, sort_keys: list[Any]) -> None:
    store = DynamoDBModel()
    store.call("create_table", sorted_table("sorted", sort_type))
    for sort_key in reversed(sort_keys):
        store.call(
            "put_item", {"TableName": "sorted", "Item": {"pk": S("p"), "sk": {sort_type: sort_key}}}
        )
    params = {"TableName": "sorted", "KeyConditionExpression": "pk = :p",
              "ExpressionAttributeValues": {":p": S("p")}}  # fmt: skip
    forward = store.call("query", params)["Items"]
    assert [item["sk"][sort_type] for item in forward] == sort_keys
    backward = store.call("query", {**params, "ScanIndexForward": False})["Items"]
    assert [item["sk"][sort_type] for item in backward] == sort_keys[::-1]
    if sort_type == "S":
        condition = "pk = :p AND begins_with(sk, :a)"
        values = {":p": S("p"), ":a": S("a")}
        prefixed = store.call(
            "query",
            {**params, "KeyConditionExpression": condition, "ExpressionAttributeValues": values},
        )
        assert [item["sk"]["S"] for item in prefixed["Items"]] == ["a", "aa"]


def test_index_items_with_equal_keys_are_in_table_key_order() -> None:
    # DynamoDB does not order the items an index holds under equal index keys; the model
    # orders them by the table's key, so that every run answers alike.
    store = model()
    for pk, sk in (("b", 2), ("a", 2), ("c", 1), ("a", 1)):
        store.call(*put(thing(pk, sk, owner=S("w"), state=S("s"))))
    by_owner = store.call(*query("#owner = :w", {":w": S("w")}, IndexName="by-owner"))["Items"]
    assert [(i["sk"]["N"], i["pk"]["S"]) for i in by_owner] == [
        ("1", "a"), ("1", "c"), ("2", "a"), ("2", "b")
    ]  # fmt: skip
    by_state = store.call(*query("#state = :s", {":s": S("s")}, IndexName="by-state"))["Items"]
    assert [(i["pk"]["S"], i["sk"]["N"]) for i in by_state] == [
        ("a", "1"), ("a", "2"), ("b", "2"), ("c", "1")
    ]  # fmt: skip


def test_stream_records_carry_counters_and_the_images_the_view_type_asks_for() -> None:
    store = model()
    keys_only_table = {**SINGLES_TABLE, "TableName": "keys-only"}
    keys_only_table["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
    store.call("create_table", keys_only_table)
    reader, keys_only = store.stream_records(THINGS), store.stream_records("keys-only")
    assert reader() == []
    store.call(*put(ALICE))
    store.call("put_item", {"TableName": "keys-only", "Item": {"pk": S("k"), "v": ONE}})
    store.call(*put({**ALICE, "n": TWO}))
    # MotoDynamoDB's reader drops this one: it compares images, which keys-only lacks.
    store.call("put_item", {"TableName": "keys-only", "Item": {"pk": S("k"), "v": TWO}})
    store.call(*delete("p1", 1))
    records = reader()
    assert [r["eventName"] for r in records] == ["INSERT", "MODIFY", "REMOVE"]
    assert [r["eventID"] for r in records] == ["0", "1", "2"]
    sequence = [r["dynamodb"]["SequenceNumber"] for r in records]
    assert sequence == sorted(sequence) and len({len(number) for number in sequence}) == 1
    assert [int(number) for number in sequence] == sorted({int(number) for number in sequence})
    inserted, modified, removed = (r["dynamodb"] for r in records)
    assert inserted["Keys"] == key("p1", 1)
    assert inserted["NewImage"] == ALICE and "OldImage" not in inserted
    assert modified["OldImage"] == ALICE and modified["NewImage"] == {**ALICE, "n": TWO}
    assert removed["OldImage"] == {**ALICE, "n": TWO} and "NewImage" not in removed
    assert all(change["SizeBytes"] > 0 for change in (inserted, modified, removed))
    first = records[0]
    assert first["eventSource"] == "aws:dynamodb" and first["eventVersion"] == "1.1"
    assert first["awsRegion"] == "us-east-1" and "ApproximateCreationDateTime" not in inserted
    assert first["eventSourceARN"].startswith("arn:aws:dynamodb:us-east-1:")
    fields = ["Keys", "SequenceNumber", "SizeBytes", "StreamViewType"]
    assert [(r["eventName"], sorted(r["dynamodb"])) for r in keys_only()] == [
        ("INSERT", fields),
        ("MODIFY", fields),
    ]
    assert reader() == records and reader() is not reader()  # the same records, a new list


def test_expire_deletes_what_ttl_would_and_records_it_as_ttl_does() -> None:
    store = model()
    store.call(*put(thing("p", 1, expires=N(99), owner=S("w"))))
    store.call(*put(thing("p", 2, expires=N("100.5"))))
    store.call(*put(thing("p", 3, expires=N(101))))
    store.call(*put(thing("p", 4, expires=S("1"))))  # not a number: never expires
    store.call(*put(thing("p", 5)))
    store.call("put_item", {"TableName": SINGLES, "Item": {"pk": S("x"), "expires": ONE}})  # no TTL
    assert store.expire(100.5) == 1
    assert store.expire(101) == 1  # 100.5 < 101; 101 is not
    assert [item["sk"] for item in store.call(*scan())["Items"]] == [N(3), N(4), N(5)]
    assert store.call("scan", {"TableName": SINGLES})["Count"] == 1
    assert store.call(*query("#owner = :w", {":w": S("w")}, IndexName="by-owner"))["Count"] == 0
    removed = [r for r in store.stream_records(THINGS)() if r["eventName"] == "REMOVE"]
    assert [r["dynamodb"]["Keys"] for r in removed] == [key("p", 1), key("p", 2)]
    ttl = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    assert all(r["userIdentity"] == ttl for r in removed)
    store.call(*delete("p", 3))
    assert "userIdentity" not in store.stream_records(THINGS)()[-1]


def test_nothing_a_caller_holds_is_the_model_s_own() -> None:
    store = model()
    item = thing("p", 1, tags={"SS": ["b", "a"]}, doc={"M": {"l": {"L": [ONE]}}})
    store.call(*put(item))
    item["doc"]["M"]["l"]["L"].append(TWO)  # the request, changed after the call
    got = store.call(*get("p", 1))["Item"]
    got["tags"]["SS"].append("c")
    got["doc"]["M"]["l"]["L"].clear()
    store.stream_records(THINGS)()[0]["dynamodb"]["NewImage"]["doc"]["M"].clear()
    again = store.call(*get("p", 1))["Item"]
    assert again["tags"] == {"SS": ["a", "b"]} and again["doc"] == {"M": {"l": {"L": [ONE]}}}


def test_every_run_answers_alike_whatever_the_order_sets_were_sent_in() -> None:
    def session(order: int) -> list[Any]:
        store = model()
        store.call(*put(thing("p", 1, s={"SS": ["x", "a", "m"] if order else ["m", "x", "a"]})))
        store.call(*update("p", 1, "ADD s :more", {":more": {"SS": ["c", "b"][:: 1 - 2 * order]}}))
        return [store.call(*scan()), store.stream_records(THINGS)()]

    assert session(0) == session(1)
    assert session(0)[0]["Items"][0]["s"] == {"SS": ["a", "b", "c", "m", "x"]}


def test_it_has_the_interface_of_in_process_dynamodb() -> None:
    store = DynamoDBModel("eu-west-1")
    assert store.region == "eu-west-1" and store.meta.endpoint_url.startswith("inprocess://")
    definition = TableDefinition(
        logical_id="Things",
        table_name=None,
        key_schema=tuple(THINGS_TABLE["KeySchema"]),
        attribute_definitions=tuple(THINGS_TABLE["AttributeDefinitions"]),
        indexes=tuple(
            IndexDefinition(i["IndexName"], tuple(i["KeySchema"]), i["Projection"])
            for i in THINGS_TABLE["GlobalSecondaryIndexes"]
        ),
        ttl_attribute="expires",
        stream_view_type="NEW_AND_OLD_IMAGES",
        replica_regions=(),
    )
    store.create_table(definition, "made")
    assert store.describe_time_to_live(TableName="made")["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expires",
    }
    described = store.describe_table(TableName="made")["Table"]
    assert described["TableStatus"] == "ACTIVE" and described["ItemCount"] == 0
    assert described["LatestStreamArn"].startswith("arn:aws:dynamodb:eu-west-1:")
    assert [i["IndexStatus"] for i in described["GlobalSecondaryIndexes"]] == ["ACTIVE"] * 3
    store.put_item(TableName="made", Item=ALICE)
    assert store.get_item(TableName="made", Key=key("p1", 1)) == {"Item": ALICE}
    assert store.stream_records("made")()[0]["awsRegion"] == "eu-west-1"
    assert store.list_tables(Limit=1) == {"TableNames": ["made"]}
    store.close()
    assert store.list_tables() == {"TableNames": []}

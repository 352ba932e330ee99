"""The recording proxy: who called what, routed by table, with latency and outages on demand."""

from __future__ import annotations

import time
import urllib.request
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from streamfleet_dev.emulator.aws_proxy import AwsProxy, parse_request, read_records


def _client(service: str, endpoint: str, key: str = "caller-a", **config):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key="x",
        config=Config(**{"retries": {"max_attempts": 1, "mode": "standard"}, **config}),
    )


def _table(dynamodb, name: str) -> None:
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.fixture
def proxy(servers, tmp_path):
    with AwsProxy(
        default_backend=servers["moto"].endpoint, record_path=tmp_path / "calls.jsonl"
    ) as running:
        yield running


def test_requests_are_routed_by_table_and_recorded_per_caller(servers, proxy, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    leases, messages = f"px-leases-{suffix}", f"px-messages-{suffix}"
    proxy.route_table(leases, servers["dynalite"].endpoint)
    dynamodb = _client("dynamodb", proxy.endpoint)
    _table(dynamodb, leases)
    _table(_client("dynamodb", proxy.endpoint, key="caller-b"), messages)
    direct = {name: _client("dynamodb", servers[name].endpoint) for name in ("moto", "dynalite")}
    assert leases in direct["dynalite"].list_tables()["TableNames"]
    assert messages in direct["moto"].list_tables()["TableNames"]
    dynamodb.query(
        TableName=leases,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "a"}},
    )
    with pytest.raises(ClientError, match="different backends"):
        dynamodb.batch_get_item(
            RequestItems={t: {"Keys": [{"pk": {"S": "a"}}]} for t in (leases, messages)}
        )
    sqs = _client("sqs", proxy.endpoint)
    queue = sqs.create_queue(QueueName=f"px-{suffix}")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="x")
    _client("cloudwatch", proxy.endpoint).put_metric_data(
        Namespace="App", MetricData=[{"MetricName": "m", "Value": 1.0}]
    )
    seen = [(r.access_key_id, r.service, r.operation, r.resources) for r in proxy.records()]
    assert seen == [
        ("caller-a", "dynamodb", "CreateTable", (f"table/{leases}",)),
        ("caller-b", "dynamodb", "CreateTable", (f"table/{messages}",)),
        ("caller-a", "dynamodb", "Query", (f"table/{leases}",)),
        ("caller-a", "dynamodb", "BatchGetItem", (f"table/{leases}", f"table/{messages}")),
        ("caller-a", "sqs", "CreateQueue", (f"queue/px-{suffix}",)),
        ("caller-a", "sqs", "SendMessage", (f"queue/px-{suffix}",)),
        ("caller-a", "monitoring", "PutMetricData", ("*",)),
    ]
    assert proxy.records()[-1].conditions == {"cloudwatch:namespace": "App"}
    assert read_records(tmp_path / "calls.jsonl") == proxy.records()


def test_latency_and_outage_hooks(proxy):
    sqs = _client("sqs", proxy.endpoint)
    queue = sqs.create_queue(QueueName=f"px-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    proxy.set_latency(0.3, service="sqs")
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue)
    assert time.monotonic() - started >= 0.3
    proxy.set_latency(0, service="sqs")
    proxy.set_down(True)
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        sqs.get_queue_attributes(QueueUrl=queue)
    assert proxy.records()[-1].status == 0
    request = urllib.request.Request(f"{proxy.endpoint}/__proxy__/down?on=0", method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert b'"down": []' in answer.read()
    sqs.get_queue_attributes(QueueUrl=queue)  # back


def test_management_api_requests_name_the_connection():
    parsed = parse_request(
        "POST",
        "/v1/@connections/abc%3D",
        {
            "Authorization": "AWS4-HMAC-SHA256 Credential=handler/20260101/us-west-2/"
            "execute-api/aws4_request, SignedHeaders=host, Signature=0"
        },
        b"{}",
    )
    assert (parsed.access_key_id, parsed.region, parsed.service) == (
        "handler",
        "us-west-2",
        "execute-api",
    )
    assert (parsed.operation, parsed.resources) == (
        "PostToConnection",
        ("v1/POST/@connections/abc=",),
    )


def test_index_queries_are_answered_from_a_lagging_view(servers, proxy):
    """DynamoDB's global secondary indexes are eventually consistent, dynalite's are not: the
    proxy answers an index query with what the same query was answered within the lag."""
    name = f"px-index-{uuid.uuid4().hex[:8]}"
    proxy.route_table(name, servers["dynalite"].endpoint)
    dynamodb = _client("dynamodb", proxy.endpoint)
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "group", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-group",
                "KeySchema": [{"AttributeName": "group", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )

    def by_group() -> list[str]:
        items = dynamodb.query(
            TableName=name,
            IndexName="by-group",
            KeyConditionExpression="#g = :g",
            ExpressionAttributeNames={"#g": "group"},
            ExpressionAttributeValues={":g": {"S": "g1"}},
        )["Items"]
        return sorted(item["pk"]["S"] for item in items)

    def by_key() -> list[str]:
        items = dynamodb.query(
            TableName=name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": "a"}},
        )["Items"]
        return [item["pk"]["S"] for item in items]

    proxy.set_index_lag(600)  # longer than the test: no write becomes visible by itself
    assert by_group() == []  # asked for the first time: the index as it is
    dynamodb.put_item(TableName=name, Item={"pk": {"S": "a"}, "group": {"S": "g1"}})
    assert by_group() == []  # the index has not caught up
    assert by_key() == ["a"]  # the table itself is never stale
    assert proxy.state()["stale_index_answers"] == 1
    proxy.set_index_lag(0)
    assert by_group() == ["a"]
    proxy.set_index_lag(600)
    assert by_group() == ["a"]
    dynamodb.delete_item(TableName=name, Key={"pk": {"S": "a"}})
    assert by_group() == ["a"]  # a removed row lingers
    dynamodb.put_item(TableName=name, Item={"pk": {"S": "b"}, "group": {"S": "g1"}})
    dynamodb.delete_item(TableName=name, Key={"pk": {"S": "b"}})
    assert "b" not in by_group()  # only answers the index really gave: never a row it never held
    # The lag is bounded: once the writes are older than it, the index shows them.
    proxy.set_index_lag(0.2)
    assert by_group() == []
    dynamodb.put_item(TableName=name, Item={"pk": {"S": "c"}, "group": {"S": "g1"}})
    deadline = time.monotonic() + 10
    while by_group() != ["c"]:
        assert time.monotonic() < deadline, "the index never caught up"
        time.sleep(0.05)
    with pytest.raises(ValueError, match="seconds"):
        proxy.set_index_lag(-1)


def test_throttled_requests_are_refused_as_dynamodb_does_and_not_applied(servers, proxy):
    """A throttled write is answered ProvisionedThroughputExceededException and never applied,
    so a caller's retry is the only way it lands; the SDK's retries absorb a small rate."""
    name = f"px-throttle-{uuid.uuid4().hex[:8]}"
    dynamodb = _client("dynamodb", proxy.endpoint, retries={"total_max_attempts": 1})
    _table(dynamodb, name)
    proxy.set_throttle(1.0)
    with pytest.raises(ClientError) as refused:
        dynamodb.put_item(TableName=name, Item={"pk": {"S": "a"}})
    assert refused.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert dynamodb.describe_table(TableName=name)  # control-plane calls are not throttled
    proxy.set_throttle(0)
    assert "Item" not in dynamodb.get_item(TableName=name, Key={"pk": {"S": "a"}})
    assert proxy.state()["throttled"] == 1

    proxy.set_throttle(0.2, seed=7)
    retrying = _client("dynamodb", proxy.endpoint, retries={"max_attempts": 10, "mode": "standard"})
    for index in range(20):
        retrying.put_item(TableName=name, Item={"pk": {"S": f"k{index}"}})
    assert len(dynamodb.scan(TableName=name)["Items"]) == 20
    assert proxy.state()["throttled"] > 1
    with pytest.raises(ValueError, match="rate"):
        proxy.set_throttle(1.5)


def _answered(call):
    """``call()`` until a draw processes part of the batch: one may still refuse it whole."""
    for _ in range(20):
        try:
            return call()
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    raise AssertionError("every draw refused the batch whole")


def test_a_throttled_batch_is_applied_in_part_and_returns_the_rest_as_unprocessed(servers, proxy):
    """DynamoDB throttles a batch's items, not only the whole batch: a BatchWriteItem or
    BatchGetItem answers with the items it could not process, and only those are not applied.
    The proxy refused throttled batches whole, so no caller's unprocessed-items path ran."""
    name = f"px-batch-{uuid.uuid4().hex[:8]}"
    dynamodb = _client("dynamodb", proxy.endpoint, retries={"total_max_attempts": 1})
    _table(dynamodb, name)
    keys = [f"k{index:02}" for index in range(10)]
    proxy.set_throttle(1.0, seed=3)
    written = _answered(
        lambda: dynamodb.batch_write_item(
            RequestItems={name: [{"PutRequest": {"Item": {"pk": {"S": k}}}} for k in keys]}
        )
    )
    left = {r["PutRequest"]["Item"]["pk"]["S"] for r in written["UnprocessedItems"][name]}
    proxy.set_throttle(0)
    stored = {item["pk"]["S"] for item in dynamodb.scan(TableName=name)["Items"]}
    assert left and stored and stored | left == set(keys) and not stored & left

    proxy.set_throttle(1.0, seed=5)
    request = {name: {"Keys": [{"pk": {"S": k}} for k in keys], "ConsistentRead": True}}
    read = _answered(lambda: dynamodb.batch_get_item(RequestItems=request))
    unread = read["UnprocessedKeys"][name]
    assert unread["ConsistentRead"] is True  # the request's parameters come back with the keys
    got = {item["pk"]["S"] for item in read["Responses"].get(name, [])}
    missing = {key["pk"]["S"] for key in unread["Keys"]}
    assert missing and got == stored - missing  # the processed keys, read; the rest returned
    assert proxy.state()["partly_throttled"] == 2


def test_the_same_seed_throttles_the_same_requests(servers, proxy):
    name = f"px-seeded-{uuid.uuid4().hex[:8]}"
    dynamodb = _client("dynamodb", proxy.endpoint, retries={"total_max_attempts": 1})
    _table(dynamodb, name)

    def pattern() -> list[bool]:
        outcomes = []
        for _ in range(40):
            try:
                dynamodb.get_item(TableName=name, Key={"pk": {"S": "a"}})
                outcomes.append(False)
            except ClientError:
                outcomes.append(True)
        return outcomes

    proxy.set_throttle(0.25, seed=11)
    first = pattern()
    proxy.set_throttle(0.25, seed=11)
    assert pattern() == first and any(first) and not all(first)

"""The event router's harness: its handler called with API Gateway REST proxy events, against a
lease table and a queue on moto's server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from streamfleet import event_router, model
from streamfleet.lease.dynamo import from_item
from streamfleet.worker.upstream_policy import UpstreamPolicy
from streamfleet_dev.tables import create_tables

ALLOWED_UPSTREAMS = "ws://127.0.0.1:8765,wss://*.feeds.example.com"


POLICY = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", ALLOWED_UPSTREAMS)


URL = "ws://127.0.0.1:8765/a"


CONTEXT = SimpleNamespace(aws_request_id="test-request")


def proxy_event(
    method: str,
    path: str,
    *,
    body: str | None = None,
    is_base64: bool = False,
    path_parameters: dict[str, str] | None = None,
    resource: str | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event (payload 1.0) as API Gateway sends it."""
    return {
        "resource": resource or path,
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {"resourcePath": resource or path, "httpMethod": method, "stage": "t"},
        "body": body,
        "isBase64Encoded": is_base64,
    }


@dataclass
class Router:
    """A lease table and a queue on moto, the router's environment pointing at them."""

    table: str
    messages_table: str
    queue_url: str
    dynamodb: Any
    sqs: Any
    statuses: list[int] = field(default_factory=list)

    def call(self, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        result = event_router.handler(event, CONTEXT)
        assert result["headers"]["Content-Type"] == "application/json"
        self.statuses.append(result["statusCode"])
        return result["statusCode"], json.loads(result["body"])

    def post(self, body: Any, *, raw: bool = False, is_base64: bool = False):
        text = body if raw or body is None else json.dumps(body)
        return self.call(proxy_event("POST", "/events", body=text, is_base64=is_base64))

    def start(self, connection_id: str, url: str = URL):
        return self.post({"event_type": "START", "connection_id": connection_id, "ws_url": url})

    def stop(self, connection_id: str):
        return self.post({"event_type": "STOP", "connection_id": connection_id})

    def get(self, connection_id: str):
        return self.call(
            proxy_event(
                "GET",
                f"/connections/{connection_id}",
                resource=event_router.CONNECTION_RESOURCE,
                path_parameters={"connection_id": connection_id},
            )
        )

    def items(self) -> list[dict[str, Any]]:
        pages = self.dynamodb.get_paginator("scan").paginate(
            TableName=self.table, ConsistentRead=True
        )
        return sorted(
            (from_item(raw) for page in pages for raw in page["Items"]), key=lambda i: i["pk"]
        )

    def row(self, connection_id: str) -> dict[str, Any] | None:
        response = self.dynamodb.get_item(
            TableName=self.table,
            Key={"pk": {"S": model.connection_pk(connection_id)}},
            ConsistentRead=True,
        )
        return from_item(response.get("Item"))

    def drain(self) -> list[str]:
        """Every message now in the queue (received and deleted): what arrived since last time."""
        bodies = []
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=60,
            ).get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(message["Body"])
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )

    def queue_depth(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )


@pytest.fixture
def router(moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[Router]:
    yield from router_on_servers(monkeypatch)


def router_on_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Router]:
    """The router's tables and queue where the endpoint variables point, deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    dynamodb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    lease, messages = f"router-leases-{suffix}", f"router-messages-{suffix}"
    create_tables(dynamodb, lease_table=lease, messages_table=messages)
    queue_url = sqs.create_queue(QueueName=f"router-intake-{suffix}")["QueueUrl"]
    monkeypatch.setenv("TABLE_NAME", lease)
    monkeypatch.setenv("QUEUE_URL", queue_url)
    monkeypatch.setenv("ALLOWED_UPSTREAMS", ALLOWED_UPSTREAMS)
    monkeypatch.delenv("MAX_BODY_BYTES", raising=False)
    event_router.reset()
    yield Router(lease, messages, queue_url, dynamodb, sqs)
    event_router.reset()
    for name in (lease, messages):
        dynamodb.delete_table(TableName=name)
    sqs.delete_queue(QueueUrl=queue_url)

"""A CloudFormation custom resource: the stream ARN of a table in this Region.

A global table's replica has a stream of its own, whose ARN ends in a label set when the
replica was created, and CloudFormation can only return the stream of the replica in the
template's own Region, and only from the stack that declares the table (see
aws-cloudformation/cloudformation-coverage-roadmap#1988). The fan-out's event source mapping in
each Region needs *its* replica's stream, so this function asks DynamoDB at deploy time
(``DescribeTable``, ``LatestStreamArn``) and answers CloudFormation through the pre-signed
``ResponseURL``, as a Lambda-backed custom resource does.

Properties: ``TableName`` (required). Returns the attribute ``StreamArn``. ``Delete`` does
nothing (it only read). A table without a stream fails the deployment with that reason.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

import boto3
from botocore.config import Config

from ..logs import log_event

logger = logging.getLogger(__name__)

ATTRIBUTE = "StreamArn"
_CONFIG = Config(connect_timeout=2.0, read_timeout=5.0, retries={"max_attempts": 5})
RESPONSE_TIMEOUT_SECONDS = 10.0


def stream_arn(table_name: str, dynamodb: Any | None = None) -> str:
    """The ``LatestStreamArn`` of ``table_name`` here; ``ValueError`` if it has no stream."""
    client = dynamodb or boto3.client("dynamodb", config=_CONFIG)
    table = client.describe_table(TableName=table_name)["Table"]
    arn = table.get("LatestStreamArn")
    if not arn or not (table.get("StreamSpecification") or {}).get("StreamEnabled", True):
        raise ValueError(f"TableName: {table_name} has no stream in this Region")
    return str(arn)


def respond(event: dict[str, Any], status: str, *, reason: str = "", data: dict | None = None):
    """PUT the custom resource's answer to CloudFormation's pre-signed URL."""
    body = {
        "Status": status,
        "Reason": reason[:1000] or status,
        "PhysicalResourceId": event.get("PhysicalResourceId")
        or f"stream-arn-{event.get('LogicalResourceId', 'lookup')}",
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "NoEcho": False,
        "Data": data or {},
    }
    encoded = json.dumps(body).encode()
    request = urllib.request.Request(
        event["ResponseURL"],
        data=encoded,
        method="PUT",
        headers={"Content-Type": "", "Content-Length": str(len(encoded))},
    )
    # The pre-signed https URL CloudFormation sent with the request.
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_SECONDS) as response:
        response.read()


def handler(event: dict[str, Any], context: Any) -> None:
    """Lambda entry point (``streamfleet.wsapi.stream_lookup.handler``)."""
    request_type = event.get("RequestType")
    table = (event.get("ResourceProperties") or {}).get("TableName", "")
    try:
        if request_type == "Delete":
            respond(event, "SUCCESS")
            return
        arn = stream_arn(str(table))
    except Exception as exc:  # whatever it is, CloudFormation must hear about it
        log_event(logger, logging.ERROR, "stream_lookup", table=table, detail=str(exc))
        respond(event, "FAILED", reason=f"{type(exc).__name__}: {exc}")
        return
    log_event(logger, logging.INFO, "stream_lookup", table=table, streamArn=arn)
    respond(event, "SUCCESS", data={ATTRIBUTE: arn})

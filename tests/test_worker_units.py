"""The worker's edges, without servers: configuration, allow-list, upstream protocol, metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    ReadTimeoutError,
)

from streamfleet import model
from streamfleet.lease.dynamo import is_transient
from streamfleet.worker.config import WorkerConfig
from streamfleet.worker.observability import Counters, emf_document
from streamfleet.worker.protocol import JsonSeqProtocol, ProtocolError
from streamfleet.worker.upstream_policy import UpstreamPolicy, UpstreamRefused

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
BASE_ENV = {
    "TABLE_NAME": "leases",
    "MESSAGES_TABLE_NAME": "messages",
    "QUEUE_URL": "http://127.0.0.1:1/queue/intake",
    "ALLOWED_UPSTREAMS": "wss://*.feeds.example.com,ws://127.0.0.1:8765",
}


def test_a_complete_environment_is_read_with_fractional_seconds():
    config = WorkerConfig.from_env(
        {**BASE_ENV, "LEASE_SECONDS": "2", "HEARTBEAT_EVERY": "0.5", "MAX_CONNECTIONS": "30"}
    )
    assert config.timing.lease_seconds == 2.0
    assert config.timing.heartbeat_seconds == 0.5
    assert config.max_connections == 30
    assert config.worker_id.startswith("worker-")  # a fresh unique id by default


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"TABLE_NAME": ""}, "TABLE_NAME"),
        ({"QUEUE_URL": None}, "QUEUE_URL"),
        ({"LEASE_SECONDS": "-1"}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "soon"}, "LEASE_SECONDS"),
        ({"HEARTBEAT_EVERY": "0"}, "HEARTBEAT_EVERY"),
        ({"LEASE_SECONDS": "20", "HEARTBEAT_EVERY": "10"}, "HEARTBEAT_EVERY"),
        ({"HEALTH_PORT": "abc"}, "HEALTH_PORT"),
        ({"MESSAGE_RETENTION_DAYS": "never"}, "MESSAGE_RETENTION_DAYS"),
        ({"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS"),
        ({"MAX_CONNECTIONS": "1.5"}, "MAX_CONNECTIONS"),
        ({"WORKER_ID": "has space"}, "WORKER_ID"),
        ({"SQS_WAIT_SECONDS": "25"}, "SQS_WAIT_SECONDS"),
        ({"ALLOWED_UPSTREAMS": "http://x"}, "ALLOWED_UPSTREAMS"),
        ({"ALLOWED_UPSTREAMS": "ws://host:99999"}, "ALLOWED_UPSTREAMS"),
        ({"HEALTH_PORT": "70000"}, "HEALTH_PORT"),
    ],
)
def test_a_bad_variable_is_named(change, field):
    env = {**BASE_ENV, **change}
    env = {key: value for key, value in env.items() if value is not None}
    with pytest.raises(ValueError, match=rf"^{field}: "):
        WorkerConfig.from_env(env)


def test_the_worker_refuses_to_start_on_bad_configuration():
    result = subprocess.run(
        [sys.executable, "-m", "streamfleet.worker"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(RUNTIME), **BASE_ENV, "LEASE_SECONDS": "0"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert json.loads(result.stderr)["error"].startswith("LEASE_SECONDS: ")


POLICY = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", BASE_ENV["ALLOWED_UPSTREAMS"])


@pytest.mark.parametrize(
    "url", ["wss://a.feeds.example.com/x", "wss://b.c.feeds.example.com:9443/y?z=1"]
)
def test_allow_listed_urls_pass(url):
    POLICY.check(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("wss://feeds.example.com/x", "not allow-listed"),  # the wildcard needs a subdomain
        ("wss://evil.com/?x=.feeds.example.com", "not allow-listed"),
        ("ws://a.feeds.example.com/x", "not allow-listed"),  # wrong scheme
        ("ws://127.0.0.1:8766/x", "not allow-listed"),  # wrong port
        ("ws://169.254.169.254/latest", "not allow-listed"),
        ("http://127.0.0.1:8765/x", "scheme"),
    ],
)
def test_other_urls_are_refused_with_a_reason(url, reason):
    with pytest.raises(UpstreamRefused, match=reason):
        POLICY.check(url)


async def test_a_name_resolving_to_a_link_local_address_is_refused():
    policy = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://169.254.169.254")
    with pytest.raises(UpstreamRefused, match="forbidden address"):
        await policy.resolve("ws://169.254.169.254/latest/meta-data")


async def test_an_allowed_name_resolves_to_the_address_to_dial():
    assert await POLICY.resolve("ws://127.0.0.1:8765/streams/a") == ("127.0.0.1", 8765)


def test_the_default_protocol_resumes_with_last_seq_in_the_query():
    protocol = JsonSeqProtocol()
    assert protocol.dial_url("ws://h/s?a=1", resume_after=None, epoch=1) == "ws://h/s?a=1&epoch=1"
    assert protocol.dial_url("ws://h/s", resume_after=0, epoch=2) == "ws://h/s?last_seq=0&epoch=2"
    assert (
        protocol.dial_url("ws://h/s?a=1&last_seq=3&epoch=1", resume_after=42, epoch=7)
        == "ws://h/s?a=1&last_seq=42&epoch=7"
    )
    message = protocol.parse('{"seq": 7, "data": {"x": 1}}')
    assert (message.seq, message.data) == (7, {"x": 1})


@pytest.mark.parametrize("frame", ["nope", "[1]", '{"data": 1}', '{"seq": 0}', '{"seq": true}'])
def test_malformed_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        JsonSeqProtocol().parse(frame)


def test_the_metric_document_names_exactly_what_the_scaling_policy_tracks():
    document = emf_document("svc", 12, Counters(leases_lost=1, handoffs=3))
    [directive] = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == model.METRIC_NAMESPACE
    assert directive["Dimensions"] == [[model.METRIC_DIMENSION_SERVICE]]
    names = [metric["Name"] for metric in directive["Metrics"]]
    assert model.METRIC_ACTIVE_CONNECTIONS in names
    assert document[model.METRIC_ACTIVE_CONNECTIONS] == 12
    assert document[model.METRIC_DIMENSION_SERVICE] == "svc"


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectionClosedError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectionResetError(), True),
        (
            ClientError({"Error": {"Code": "ThrottlingException"}}, "UpdateItem"),
            True,
        ),
        (
            ClientError(
                {"Error": {"Code": "Whatever"}, "ResponseMetadata": {"HTTPStatusCode": 503}},
                "UpdateItem",
            ),
            True,
        ),
        (NoCredentialsError(), False),
        (NoRegionError(), False),
        (ParamValidationError(report="Missing required parameter"), False),
        (ClientError({"Error": {"Code": "ConditionalCheckFailedException"}}, "UpdateItem"), False),
        (ClientError({"Error": {"Code": "ValidationException"}}, "UpdateItem"), False),
    ],
)
def test_only_network_trouble_throttling_and_5xx_are_retried(error, transient):
    """Missing credentials or a malformed request fail at once with their own message instead
    of being retried until the deadline and reported as DynamoDB being unavailable."""
    assert is_transient(error) is transient

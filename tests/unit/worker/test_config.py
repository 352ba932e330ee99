"""The worker's configuration from its environment: every bad variable named, nothing started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamfleet.worker.config import WorkerConfig

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"
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
        # A stored message is one DynamoDB item (400 KB): a bigger limit accepted messages that
        # failed their whole batch, cutting other streams' connections.
        ({"MAX_MESSAGE_BYTES": str(1024 * 1024)}, "MAX_MESSAGE_BYTES"),
        ({"MAX_MESSAGE_BYTES": "0"}, "MAX_MESSAGE_BYTES"),
        # 700 connections each buffering up to 5 frames of 384 KiB cannot fit in 1 GiB.
        (
            {"MEMORY_LIMIT_MIB": "1024", "MAX_MESSAGE_BYTES": str(384 * 1024)},
            "MAX_CONNECTIONS, MAX_MESSAGE_BYTES, MAX_WORKER_BUFFERED_BYTES",
        ),
        ({"MEMORY_LIMIT_MIB": "lots"}, "MEMORY_LIMIT_MIB"),
        ({"MAX_WORKER_BUFFERED_BYTES": "0"}, "MAX_WORKER_BUFFERED_BYTES"),
        # The metrics' service dimension: what scaling and the alarms count by.
        ({"SERVICE_NAME": "feeds eu"}, "SERVICE_NAME"),
        ({"SERVICE_NAME": "x" * 65}, "SERVICE_NAME"),
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


def test_the_health_port_is_off_unset_and_any_free_one_at_zero():
    assert WorkerConfig.from_env(BASE_ENV).health_port is None
    assert WorkerConfig.from_env({**BASE_ENV, "HEALTH_PORT": "0"}).health_port == 0
    assert WorkerConfig.from_env({**BASE_ENV, "HEALTH_PORT": "8080"}).health_port == 8080

"""The operator CLI as a newcomer meets it: START checks the allow-list and says so,
``--json`` output pipes into a JSON tool even through ``make``, the lag is in messages as in the
live view, and a missing region or an unreachable endpoint is one clear line, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from streamfleet import model
from streamfleet_dev.emulator.servers import free_port
from streamfleet_dev.tables import create_tables
from streamfleet_ops.cli import connection_rows

REPO = Path(__file__).resolve().parents[2]
ALLOWED = "wss://*.feeds.example.com,ws://127.0.0.1:8765"


@pytest.fixture
def fleet(moto):
    """A lease table, a messages table and a queue on the moto server."""
    suffix = uuid.uuid4().hex[:8]
    lease, messages = f"cli-leases-{suffix}", f"cli-messages-{suffix}"
    dynamodb = boto3.client("dynamodb")
    create_tables(dynamodb, lease_table=lease, messages_table=messages)
    queue_url = boto3.client("sqs").create_queue(QueueName=f"cli-{suffix}")["QueueUrl"]
    yield {"TABLE_NAME": lease, "MESSAGES_TABLE_NAME": messages, "QUEUE_URL": queue_url}
    for name in (lease, messages):
        dynamodb.delete_table(TableName=name)


def cli(*args: str, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()):
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO)]),
        **(env or {}),
    }
    for name in drop:
        environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "streamfleet_ops.cli", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _rows(fleet) -> list[dict]:
    items = boto3.client("dynamodb").scan(TableName=fleet["TABLE_NAME"])["Items"]
    return [i for i in items if i[model.PK]["S"].startswith(model.CONNECTION_PREFIX)]


def _queued(fleet) -> list[str]:
    messages = boto3.client("sqs").receive_message(
        QueueUrl=fleet["QUEUE_URL"], MaxNumberOfMessages=10, WaitTimeSeconds=0
    )
    return [m["Body"] for m in messages.get("Messages", [])]


def test_start_of_an_allowed_url_writes_and_notifies(fleet):
    result = cli(
        "start",
        "m-1",
        "wss://a.feeds.example.com/m/1",
        "--json",
        env={**fleet, "ALLOWED_UPSTREAMS": ALLOWED},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"connection_id": "m-1", "outcome": "created", "notified": True}
    ]
    assert len(_rows(fleet)) == 1
    assert _queued(fleet) == [model.notification_body(model.connection_pk("m-1"))]


def test_start_of_a_url_off_the_allow_list_is_refused_and_writes_nothing(fleet):
    result = cli(
        "start",
        "meeting-1",
        "wss://feeds.example.com/m/1",  # the apex is not under *.
        env={**fleet, "ALLOWED_UPSTREAMS": ALLOWED},
    )
    assert result.returncode == 1
    assert "refused, nothing written" in result.stderr and "not allow-listed" in result.stderr
    assert result.stdout == ""
    assert _rows(fleet) == [] and _queued(fleet) == []


def test_start_takes_the_allow_list_from_the_option_too(fleet):
    result = cli(
        "start",
        "m-2",
        "ws://127.0.0.1:9999/streams/x",
        "--allowed-upstreams",
        ALLOWED,
        env=fleet,
        drop=("ALLOWED_UPSTREAMS",),
    )
    assert result.returncode == 1 and "127.0.0.1:9999 is not allow-listed" in result.stderr
    assert _rows(fleet) == []


def test_start_without_an_allow_list_says_which_setting_is_missing(fleet):
    result = cli(
        "start", "m-3", "wss://a.feeds.example.com/", env=fleet, drop=("ALLOWED_UPSTREAMS",)
    )
    assert result.returncode == 2
    assert "ALLOWED_UPSTREAMS / --allowed-upstreams: not set" in result.stderr
    assert _rows(fleet) == []


def test_connections_lag_is_in_messages_like_the_live_view(fleet):
    dynamodb = boto3.client("dynamodb")
    now_ms = 1_700_000_000_000
    dynamodb.put_item(
        TableName=fleet["TABLE_NAME"],
        Item={
            model.PK: {"S": model.connection_pk("lagging")},
            model.DESIRED_STATE: {"S": "STARTED"},
            model.LAST_SEQ: {"N": "5"},
            model.UPDATED_AT_MS: {"N": str(now_ms)},
        },
    )
    for seq in range(1, 10):
        dynamodb.put_item(
            TableName=fleet["MESSAGES_TABLE_NAME"],
            Item={model.PK: {"S": model.connection_pk("lagging")}, model.SEQ: {"N": str(seq)}},
        )
    result = cli("connections", "--json", env=fleet)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["last_seq"], row["stored_seq"], row["lag"]) == (5, 9, 4)
    assert "lag_s" not in row and row["updated_ago_s"] > 0
    without = cli("connections", "--json", env=fleet, drop=("MESSAGES_TABLE_NAME",))
    (row,) = json.loads(without.stdout)
    assert row["lag"] is None and row["stored_seq"] is None  # unknown, never a guess


def test_connection_rows_lag_counts_from_the_origin_when_never_checkpointed():
    item = {model.PK: model.connection_pk("x"), model.ORIGIN_SEQ: 100, model.UPDATED_AT_MS: 0}
    (row,) = connection_rows([item], 1000, {model.connection_pk("x"): 130})
    assert row["lag"] == 30 and row["last_seq"] is None


def test_make_cli_json_output_pipes_into_json_tool(fleet):
    """The documented command (docs/operations.md): make must not echo the recipe into stdout."""
    if not (REPO / ".venv" / ".installed").exists():
        pytest.fail("make setup has not run (the suite runs under make test)")
    make = subprocess.run(
        ["make", "--no-print-directory", "cli", "ARGS=connections --json"],
        cwd=REPO,
        env={**os.environ, **fleet},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert make.returncode == 0, make.stderr
    tool = subprocess.run(
        [sys.executable, "-m", "json.tool"], input=make.stdout, capture_output=True, text=True
    )
    assert tool.returncode == 0, f"not JSON: {make.stdout!r}"
    assert json.loads(make.stdout) == []


def test_a_missing_region_is_one_clear_line(fleet, tmp_path):
    result = cli(
        "connections",
        env={
            **fleet,
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        },
        drop=("AWS_REGION", "AWS_DEFAULT_REGION"),
    )
    assert result.returncode == 2
    assert result.stderr.startswith("AWS region: not set") and "Traceback" not in result.stderr


def test_an_unreachable_endpoint_is_one_clear_line(fleet):
    dead = f"http://127.0.0.1:{free_port()}"
    result = cli("connections", env={**fleet, "AWS_ENDPOINT_URL_DYNAMODB": dead})
    assert result.returncode == 1
    assert f"cannot connect to {dead}" in result.stderr and "Traceback" not in result.stderr

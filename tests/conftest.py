"""Fixtures: real DynamoDB-compatible servers on loopback, started by the tests themselves.

The lease conformance suite runs against every backend in ``BACKENDS``: moto's server mode and
dynalite always; real DynamoDB too when ``STREAMFLEET_TEST_AWS=1`` (using the ambient AWS
credentials and region). Code under test reaches a backend only through
``AWS_ENDPOINT_URL_DYNAMODB``, as it would reach AWS.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import boto3
import pytest

from streamfleet_dev.local.servers import LOCAL_AWS_ENV, LocalServer, dynalite_server, moto_server
from tests.wsapi_support import gateway, tables  # noqa: F401 - fixtures of the WebSocket API tests

USE_AWS = os.environ.get("STREAMFLEET_TEST_AWS") == "1"
BACKENDS = ["moto", "dynalite", *(["aws"] if USE_AWS else [])]


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalServer]]:
    """Started on first use, stopped at the end of the run."""
    logs = tmp_path_factory.mktemp("server-logs")
    started: dict[str, LocalServer] = {}

    class Lazy(dict):
        def __missing__(self, kind: str) -> LocalServer:
            factory = {"moto": moto_server, "dynalite": dynalite_server}[kind]
            server = factory(log_path=logs / f"{kind}.log").start()
            started[kind] = server
            self[kind] = server
            return server

    yield Lazy()
    for server in started.values():
        server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, servers, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the standard endpoint variable at one DynamoDB implementation."""
    if request.param != "aws":
        for name, value in LOCAL_AWS_ENV.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers[request.param].endpoint)
    return request.param


@pytest.fixture
def moto(servers, monkeypatch: pytest.MonkeyPatch) -> LocalServer:
    """moto alone, for DynamoDB and SQS (dynalite has no SQS)."""
    server = servers["moto"]
    for name, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", server.endpoint)
    return server


@pytest.fixture
def table_names(backend: str) -> Iterator[tuple[str, str]]:
    """A fresh lease table and messages table, deleted afterwards."""
    from streamfleet_dev.tables import create_tables

    suffix = uuid.uuid4().hex[:10]
    lease, messages = f"test-leases-{suffix}", f"test-messages-{suffix}"
    client = boto3.client("dynamodb")
    create_tables(client, lease_table=lease, messages_table=messages)
    yield lease, messages
    for name in (lease, messages):
        client.delete_table(TableName=name)

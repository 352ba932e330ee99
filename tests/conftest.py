"""Fixtures: real DynamoDB-compatible servers on loopback, started by the tests themselves.

Every test lives in a tier folder and carries that tier's marker (``-m integration``): ``unit``
(no server, no process), ``infra`` (synth, snapshots, cdk-nag, template assertions), ``artifact``
(the synthesized assets and assembly run as deployed), ``integration`` (local servers over
loopback, outcome assertions only), ``e2e`` (real worker fleets, the fault harness, drills, local
mode, Chromium, chaos) and ``sim`` (seeded simulations). The session fails if a process the suite
started is still running at its end.

The lease conformance suite runs against every backend in ``BACKENDS``: moto's server mode,
dynalite and the simulations' store always; real DynamoDB too when ``STREAMFLEET_TEST_AWS=1``
(using the ambient AWS credentials and region). Code under test reaches a backend only through
``AWS_ENDPOINT_URL_DYNAMODB``, as it would reach AWS.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV, TEST_RUN_VARIABLE, LocalServer
from streamfleet_dev.local.reaper import process_stat
from tests.router_support import router  # noqa: F401 - the event router on moto
from tests.support import BACKENDS, servers_on_demand, use_backend
from tests.wsapi_live_support import moto_tables  # noqa: F401 - every live-delivery table on moto
from tests.wsapi_support import gateway, tables  # noqa: F401 - fixtures of the WebSocket API tests

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "infra", "artifact", "integration", "e2e", "sim")
# Inherited by every process the suite starts (the local launchers of workers and Lambda
# functions pass it through): what is left at the end carries it.
RUN_TOKEN_VARIABLE = TEST_RUN_VARIABLE
LEFTOVER_GRACE_SECONDS = 10.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in a tier folder: {TIERS}")
        item.add_marker(getattr(pytest.mark, tier))


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(RUN_TOKEN_VARIABLE, uuid.uuid4().hex)


# The CDK's jsii kernel: a Node process the interpreter itself owns and ends at its exit.
INTERPRETER_OWNED = ("jsii-runtime",)


def _leftovers(token: str, since: int) -> dict[int, str]:
    """Processes started since ``since`` that carry this run's token: this run started them
    (a process of another run, or of the developer's ``make local``, carries none or another)."""
    commands: dict[int, str] = {}
    parents: dict[int, int] = {}
    found: list[int] = []
    mark = f"{RUN_TOKEN_VARIABLE}={token}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            parent, started = process_stat(entry.name)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or a zombie's
            continue
        pid = int(entry.name)
        commands[pid], parents[pid] = command.strip(), parent
        if command and started >= since and mark in environment.split(b"\0"):
            found.append(pid)

    def owned_by_the_interpreter(pid: int) -> bool:
        while pid in commands:
            if any(name in commands[pid] for name in INTERPRETER_OWNED):
                return True
            pid = parents[pid]
        return False

    return {pid: commands[pid] for pid in found if not owned_by_the_interpreter(pid)}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not hasattr(session.config, "workerinput") and os.name == "posix" and Path("/proc").is_dir():
        token, since = os.environ[RUN_TOKEN_VARIABLE], process_stat(os.getpid())[1]
        deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS  # a process may still be exiting
        while (left := _leftovers(token, since)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            lines = "\n".join(f"  pid {pid}: {command[:200]}" for pid, command in left.items())
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = f"processes the test run started are still running (now killed):\n{lines}"
            if reporter is not None:
                reporter.write_sep("=", "leftover processes", red=True)
                reporter.write_line(message)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalServer]]:
    """Started on first use, stopped at the end of the run. A test that freezes, kills or
    restarts a server uses servers of its own (:func:`tests.support.servers_on_demand`)."""
    with servers_on_demand(tmp_path_factory.mktemp("server-logs")) as started:
        yield started


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, servers, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each DynamoDB implementation in turn."""
    return use_backend(request.param, servers, monkeypatch)


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

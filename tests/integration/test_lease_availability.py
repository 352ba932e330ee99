"""A slow or unreachable DynamoDB is retried until the deadline, never mistaken for a lost lease.

The server process is frozen with SIGSTOP (it accepts connections but never answers), which is
what a throttled or partitioned DynamoDB looks like from the client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.lease import LeaseStore, LeaseTiming, StoreUnavailable
from streamfleet_dev.emulator.servers import LocalServer
from tests.support import servers_on_demand

TIMING = LeaseTiming(
    lease_seconds=2.0,
    heartbeat_seconds=0.5,
    max_clock_skew_seconds=0.25,
    safety_margin_seconds=0.25,
)
FAST_TIMEOUTS = ClientSettings(threads=4, connect_timeout_seconds=0.2, read_timeout_seconds=0.3)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalServer]]:
    """Servers of this module's own: it freezes them (a test failing before it thaws one must
    not hang every later test of the run)."""
    with servers_on_demand(tmp_path_factory.mktemp("frozen-server-logs")) as started:
        yield started


@pytest.fixture
async def store(table_names, backend, servers) -> AsyncIterator[LeaseStore]:
    client = AsyncClient("dynamodb", settings=FAST_TIMEOUTS)
    store = LeaseStore.create(
        table_name=table_names[0], worker_id="w1", timing=TIMING, dynamodb=client
    )
    await store.session.open()
    yield store
    client.close()


def freeze(servers, backend: str) -> int:
    pid = servers[backend].process.pid
    os.kill(pid, signal.SIGSTOP)
    return pid


@pytest.mark.parametrize("backend", ["moto", "dynalite"], indirect=True)
async def test_a_brief_outage_is_retried_and_the_renewal_succeeds(store, servers, backend):
    pid = freeze(servers, backend)
    asyncio.get_running_loop().call_later(0.6, os.kill, pid, signal.SIGCONT)
    started = time.monotonic()

    assert await store.session.renew() is True

    assert time.monotonic() - started >= 0.5
    assert not store.session.deadline_passed()


@pytest.mark.parametrize("backend", ["moto", "dynalite"], indirect=True)
async def test_an_outage_past_the_deadline_is_unavailable_not_lost(store, servers, backend):
    deadline = store.session.deadline
    pid = freeze(servers, backend)
    try:
        with pytest.raises(StoreUnavailable):
            await store.session.renew()
        # Given up at the deadline (plus at most one request in flight), not hanging on.
        one_request = FAST_TIMEOUTS.connect_timeout_seconds + FAST_TIMEOUTS.read_timeout_seconds
        assert time.monotonic() <= deadline + one_request + 5.0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert store.session.deadline_passed()
    # Back online: the next renewal opens a new session rather than reviving the old one.
    old = store.session.version
    assert await store.session.renew() is False
    assert store.session.version != old

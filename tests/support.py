"""Small helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamfleet.aws import AsyncClient
from streamfleet_dev.emulator.servers import (
    LOCAL_AWS_ENV,
    LocalServer,
    dynalite_server,
    moto_server,
    sim_dynamodb_server,
)

# The lease conformance suite runs against each: moto's server, dynalite and the simulations'
# in-process store (behind the wire protocol) always, real DynamoDB too with
# STREAMFLEET_TEST_AWS=1 (the ambient AWS credentials and region). What the simulations find
# holds only as far as their store answers as these do.
USE_AWS = os.environ.get("STREAMFLEET_TEST_AWS") == "1"
SIM_STORE = "sim-store"
BACKENDS = ["moto", "dynalite", SIM_STORE, *(["aws"] if USE_AWS else [])]
# dynalite behind the recording proxy, whose index answers lag as DynamoDB's may (neither server
# lags on its own): the lease contract must hold with a stale index too.
LAGGING = "dynalite-lagging-index"
LEASE_BACKENDS = [*BACKENDS, LAGGING]


@dataclass
class ShiftableClock:
    """The system clocks plus an offset a test can advance: a pause without sleeping.

    Advancing the clock shared by a holder and a taker is what a paused holder experiences (time
    went by, it did nothing); advancing only the taker's is a clock running ahead.
    """

    offset: float = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000 + round(self.offset * 1000)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class StoppedClock(ShiftableClock):
    """A clock that moves only when a test advances it.

    For a test whose outcome hangs on a deadline not having passed yet (a hold-off of half a
    second): on a loaded machine the steps between two calls can take longer than that.
    """

    monotonic_at_start: float = field(default_factory=time.monotonic)
    wall_ms_at_start: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def monotonic(self) -> float:
        return self.monotonic_at_start + self.offset

    def wall_ms(self) -> int:
        return self.wall_ms_at_start + round(self.offset * 1000)


class CountingClient(AsyncClient):
    """An :class:`AsyncClient` whose request counts a test can reset and read."""

    @property
    def calls(self) -> dict[str, int]:
        return dict(self.requests)

    def total(self) -> int:
        return sum(self.requests.values())

    def reset(self) -> None:
        self.requests.clear()


@contextlib.contextmanager
def servers_on_demand(logs: Path) -> Iterator[dict[str, LocalServer]]:
    """``servers["moto"]``, ``servers["dynalite"]`` or ``servers[SIM_STORE]`` started on first
    use; all stopped at the end, whatever a test did to them."""
    started: dict[str, LocalServer] = {}

    class Lazy(dict):
        def __missing__(self, kind: str) -> LocalServer:
            if kind == LAGGING:
                from streamfleet_dev.emulator.aws_proxy import DEFAULT_INDEX_LAG_SECONDS, AwsProxy

                server = AwsProxy(
                    default_backend=self["dynalite"].endpoint,
                    keep_records=False,
                    index_lag_seconds=DEFAULT_INDEX_LAG_SECONDS,
                ).start()
                started[kind] = server
                self[kind] = server
                return server
            factory = {
                "moto": moto_server,
                "dynalite": dynalite_server,
                SIM_STORE: sim_dynamodb_server,
            }[kind]
            server = factory(log_path=logs / f"{kind}.log").start()
            started[kind] = server
            self[kind] = server
            return server

    try:
        yield Lazy()
    finally:
        for server in started.values():
            server.stop()


def use_backend(name: str, servers: dict[str, LocalServer], monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the standard endpoint variable at one DynamoDB implementation for one test."""
    if name != "aws":
        for variable, value in LOCAL_AWS_ENV.items():
            monkeypatch.setenv(variable, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers[name].endpoint)
    return name

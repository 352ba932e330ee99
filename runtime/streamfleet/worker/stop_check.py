"""How a STOP reaches the connection it names: one query per interval for the whole worker,
never a read per connection, so that its cost does not grow with what the worker holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .. import model
from ..lease import LeaseStore, SessionLost, StoreUnavailable
from .config import WorkerConfig
from .connection import EndReason
from .holdings import Holdings


@dataclass(eq=False)
class StopCheck:
    """Asks "which of mine were stopped?" every ``stop_check_every`` and ends those."""

    config: WorkerConfig
    store: LeaseStore
    holdings: Holdings
    log: Callable[..., None]

    async def run(self) -> None:
        stopped = model.DesiredState.STOPPED.value
        clock = self.store.session.clock
        connections = self.holdings.connections
        due = clock.monotonic()
        while True:
            # Fixed rate, not fixed delay: the time a check takes does not stretch the period,
            # so a STOP is seen within one STOP_CHECK_EVERY.
            due += self.config.stop_check_every
            await asyncio.sleep(max(0.0, due - clock.monotonic()))
            due = max(due, clock.monotonic() - self.config.stop_check_every)
            try:
                flagged = [
                    pk for pk in await self.store.connections.stop_requested() if pk in connections
                ]
                if not flagged:
                    continue
                # The index may lag; confirm with one consistent batched read.
                items = await self.store.connections.read_many(flagged)
            except (StoreUnavailable, SessionLost) as exc:
                self.log("stop_check_failed", error=str(exc))
                continue
            for pk in flagged:
                item, connection = items.get(pk), connections.get(pk)
                if (
                    connection is not None
                    and item is not None
                    and item.get(model.DESIRED_STATE) == stopped
                    and item.get(model.LEASE_VERSION) == connection.lease.lease_version
                ):
                    connection.end(EndReason.STOPPED)

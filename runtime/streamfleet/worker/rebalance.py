"""Shedding surplus: a fleet that grew, or a survivor that took a dead peer's streams, is left
uneven, and nothing else would ever move a held stream. Only a worker far above the fleet's
average sheds, a few at a time, through the ordinary handoff, and never what it just took."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ..lease import LeaseStore
from .config import WorkerConfig
from .connection import EndReason
from .holdings import Holdings
from .pacing import jittered


@dataclass(eq=False)
class Rebalancer:
    """Every ``rebalance_every`` (jittered), hands off this worker's surplus, newest first."""

    config: WorkerConfig
    store: LeaseStore
    holdings: Holdings
    log: Callable[..., None]

    async def run(self) -> None:
        config = self.config
        holdings = self.holdings
        while True:
            await asyncio.sleep(jittered(config.rebalance_every))
            surplus = self.surplus()
            if surplus <= 0:
                continue
            now = self.store.session.clock.monotonic()
            movable = sorted(
                (
                    c
                    for c in holdings.connections.values()
                    if now - c.acquired_at >= config.rebalance_hold_seconds and c.end_reason is None
                ),
                key=lambda c: c.acquired_at,
                reverse=True,
            )[: min(surplus, config.rebalance_max_per_interval)]
            if movable:
                self.log("rebalancing", shedding=len(movable), holding=len(holdings.connections))
            for connection in movable:
                holdings.recently_shed[connection.pk] = now
                connection.end(EndReason.HANDOFF)

    def surplus(self) -> int:
        """How many connections above the fleet's average (plus tolerance) this worker holds."""
        holdings = self.holdings
        directory = self.store.directory
        mine = len(holdings.connections)
        peers = [
            s
            for s in holdings.fleet
            if s.owner != self.config.worker_id and not directory.is_expired(s)
        ]
        if not peers:
            return 0
        # Connections shed lately may not show in the peers' reported load yet; counting them
        # keeps a stale view from shedding twice.
        now = self.store.session.clock.monotonic()
        settling = 2 * self.config.timing.heartbeat_seconds + self.config.reconcile_every
        in_flight = sum(1 for at in holdings.recently_shed.values() if now - at < settling)
        average = (mine + in_flight + sum(s.load for s in peers)) / (len(peers) + 1)
        if mine <= average * (1 + self.config.rebalance_tolerance) or mine - average < 2:
            return 0
        return int(mine - average)

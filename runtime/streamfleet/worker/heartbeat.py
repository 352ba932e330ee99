"""Keeping the session, and keeping its promise when it cannot be kept.

Every connection this worker runs is held under its one session; a connection that outlived the
session's deadline could meet a successor upstream. So renewals run at a fixed rate on their own
client, and a watchdog ends every connection at the deadline whether or not a renewal answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..lease import LeaseTiming, SessionKeeper, SessionLost, StoreUnavailable
from .connection import EndReason
from .holdings import Holdings


@dataclass(eq=False)
class Heartbeat:
    """The heartbeat and the watchdog of one session."""

    session: SessionKeeper
    timing: LeaseTiming
    holdings: Holdings
    log: Callable[..., None]
    # Told of each new session: it holds nothing yet, and whatever the old one held is
    # claimable at once.
    on_new_session: Callable[[], None]
    renewal_lateness_max: float = field(default=0.0, init=False)

    async def run(self) -> None:
        session = self.session
        holdings = self.holdings
        clock = session.clock
        heartbeat = self.timing.heartbeat_seconds
        due = clock.monotonic()
        while True:
            # Fixed rate: a slow renewal does not push the next one back, so a DynamoDB that
            # answers within the holder's window keeps the session alive.
            due += heartbeat
            await asyncio.sleep(max(0.0, due - clock.monotonic()))
            # How late the loop woke up: a starved event loop shows here before leases suffer.
            lateness = clock.monotonic() - due
            self.renewal_lateness_max = max(self.renewal_lateness_max, lateness)
            due = max(due, clock.monotonic() - heartbeat)
            old_version = session.version
            try:
                renewed = await session.renew(load=len(holdings.connections))
                if session.drain_requested and not holdings.draining:
                    holdings.draining = True
                    self.log("draining", connections=len(holdings.connections))
                    holdings.end_all(EndReason.HANDOFF)
                if not renewed:
                    holdings.end_all(EndReason.DEADLINE)
                    self.log(
                        "session_reopened",
                        previous=old_version,
                        session_version=session.version,
                    )
                    self.on_new_session()
            except SessionLost as exc:
                holdings.end_all(EndReason.LOST)
                self.log("session_lost", error=str(exc))
                with contextlib.suppress(StoreUnavailable):
                    await session.open(load=0)
                    self.on_new_session()
            except StoreUnavailable as exc:
                self.log("renewal_failed", error=str(exc))

    async def watchdog(self) -> None:
        """The holder's promise: no connection outlives the deadline of its session."""
        session = self.session
        holdings = self.holdings
        while True:
            left = session.seconds_left()
            if left > 0:
                await asyncio.sleep(left)  # renewals only ever move the deadline later
                continue
            if holdings.connections:
                self.log("deadline_passed", connections=len(holdings.connections))
                holdings.end_all(EndReason.DEADLINE)
            await asyncio.sleep(self.timing.heartbeat_seconds / 4)

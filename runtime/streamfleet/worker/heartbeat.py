"""Keeping the session, and keeping its promise when it cannot be kept.

Every connection this worker runs is held under its one session; a connection that outlived the
session's deadline could meet a successor upstream. So renewals run at a fixed rate on their own
client, each sent whether or not the one before has answered, and a watchdog ends every
connection at the deadline whether or not a renewal answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ..lease import LeaseTiming, SessionKeeper, SessionLost, StoreUnavailable
from ..waiting import wait_at_most
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
    _renewals: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _lapsed: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _lost: int | None = field(default=None, init=False)  # the session a renewal found fenced
    _failure: BaseException | None = field(default=None, init=False)  # a renewal's own defect

    async def run(self) -> None:
        session = self.session
        clock = session.clock
        heartbeat = self.timing.heartbeat_seconds
        due = clock.monotonic()
        try:
            while True:
                due += heartbeat
                await wait_at_most(self._lapsed.wait(), max(0.0, due - clock.monotonic()))
                if self._failure is not None:
                    raise self._failure  # as if the loop had renewed itself: the worker ends
                if self._lapsed.is_set():
                    self._lapsed.clear()
                    due = clock.monotonic()  # the next renewal a heartbeat after the new session
                else:
                    # How late the loop woke up: a starved event loop shows here before leases
                    # suffer.
                    lateness = clock.monotonic() - due
                    self.renewal_lateness_max = max(self.renewal_lateness_max, lateness)
                    due = max(due, clock.monotonic() - heartbeat)
                if session.version is not None and not session.deadline_passed():
                    # Fixed rate, without waiting for the renewal before: with a store slower
                    # than a heartbeat, the renewal sent a heartbeat later answers a heartbeat
                    # later, so one that answers within the holder's window less a heartbeat
                    # keeps the session.
                    renewal = asyncio.create_task(self._renew(session.version))
                    self._renewals.add(renewal)
                    renewal.add_done_callback(self._renewal_done)
                    continue
                # No session, or it lapsed: what is still out renews the old one.
                self._cancel_renewals()
                await self._reopen()
        finally:
            self._cancel_renewals()

    async def _renew(self, version: int) -> None:
        """One renewal of session ``version``, beside any still outstanding."""
        session = self.session
        holdings = self.holdings
        # Checked with no wait before the renewal's own check: it never opens a session, which
        # only the loop does.
        if session.version != version or session.deadline_passed():
            return
        try:
            await session.renew(load=len(holdings.connections))
        except SessionLost as exc:
            if self._lost == version:
                return  # another outstanding renewal heard it first
            self._lost = version
            self._cancel_renewals()
            holdings.end_all(EndReason.LOST)
            self.log("session_lost", error=str(exc))
            self._lapsed.set()  # a new session now, not a heartbeat later
            return
        except StoreUnavailable as exc:
            self.log("renewal_failed", error=str(exc))
            return
        if session.drain_requested and not holdings.draining:
            holdings.draining = True
            self.log("draining", connections=len(holdings.connections))
            holdings.end_all(EndReason.HANDOFF)

    async def _reopen(self) -> None:
        """A new session in place of none, or of one past its deadline."""
        session = self.session
        holdings = self.holdings
        previous = session.version
        try:
            if await session.renew(load=len(holdings.connections)):
                return  # renewed after all: it was still live
        except (SessionLost, StoreUnavailable) as exc:
            self.log("renewal_failed", error=str(exc))
            return
        holdings.end_all(EndReason.DEADLINE)
        self.log("session_reopened", previous=previous, session_version=session.version)
        self.on_new_session()

    def _renewal_done(self, renewal: asyncio.Task[None]) -> None:
        self._renewals.discard(renewal)
        if not renewal.cancelled() and renewal.exception() is not None:
            self._failure = renewal.exception()
            self._lapsed.set()

    def _cancel_renewals(self) -> None:
        current = asyncio.current_task()
        for renewal in list(self._renewals):
            if renewal is not current:
                renewal.cancel()

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

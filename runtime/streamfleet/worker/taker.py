"""Taking leases: which connections this worker claims, how many, and when it looks.

Every claim, whether intake heard of the key or reconcile found it, goes through one place, so
that the rules below hold whichever loop found the key first. A fleet in which each survivor
took every orphan it found would pile a dead peer's streams onto whichever worker looked first,
and rebalancing would then move them all a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import model
from ..lease import (
    Claimable,
    Lease,
    LeaseLost,
    LeaseStore,
    LeaseTiming,
    SessionInfo,
    SessionLost,
    StoreUnavailable,
)
from ..waiting import wait_at_most
from .config import WorkerConfig
from .connection import Connection, ConnectionContext, EndReason
from .holdings import Holdings
from .pacing import jittered

# Once a minute at the default interval: one query of this worker's own rows.
AUDIT_EVERY_RECONCILES = 6
# A dead peer's streams are claimed up to the fair share plus this much (and at least one more):
# the others are left to the peers that reconcile at the same moment.
FAIR_SHARE_SLACK = 0.1
# ...unless they are still unclaimed this long after the peer died (a peer that should have
# taken them may be slow or dead itself): then anyone takes them.
FAIR_SHARE_GRACE_RECONCILES = 2


def fair_share(
    fleet: list[SessionInfo], *, me: str, mine: int, orphans: int, timing: LeaseTiming, now_ms: int
) -> int:
    """How many connections this worker should hold once ``orphans`` more are taken up: the
    fleet's total (live sessions' reported load, this worker's own count, the orphans) over the
    live workers, plus :data:`FAIR_SHARE_SLACK`."""
    live = [
        s
        for s in fleet
        if s.owner != me
        and s.state is model.SessionState.LIVE
        and not timing.is_expired_for_taker(s.expires_at_ms, now_ms)
    ]
    total = mine + orphans + sum(s.load for s in live)
    share = total / (len(live) + 1)
    return math.ceil(share + max(1.0, share * FAIR_SHARE_SLACK))


@dataclass(frozen=True)
class _Unanswered:
    """A claim that got no answer: made under ``session_version``; one of its requests may
    still be applied until ``until`` (monotonic: the worker's DynamoDB client waits a holder's
    window for an answer)."""

    session_version: int | None
    until: float


@dataclass(eq=False)
class LeaseTaker:
    """Claims connections for this worker, by these rules:

    * nothing while stopping, draining or full, nothing already held here, and nothing shed by
      rebalancing within ``rebalance_hold_seconds``;
    * one claim of a key at a time: intake, reconcile and the audit may all find it;
    * a claim answered after the session it was made under ended is given back at once;
    * a dead peer's connections are claimed up to this worker's :func:`fair_share` only, unless
      they are still unclaimed :data:`FAIR_SHARE_GRACE_RECONCILES` intervals after it died;
      unowned ones (released, or never started) by anyone;
    * reconcile runs every ``reconcile_every`` (jittered), the first time within a heartbeat,
      again when a peer's session becomes takeable, after a failure, after a new session, and
      soon after it left some orphans to peers;
    * releases that failed while the session stayed live are retried at each reconcile, and
      every :data:`AUDIT_EVERY_RECONCILES` reconciles this worker's own rows that it does not
      run are given back.

    ``connection_factory`` runs each claimed lease: unset (the worker never sets it), the
    worker's :class:`Connection`. It exists so that the deterministic lease simulation
    (``streamfleet_dev.dsim.lease_core``) can run this class unchanged, its claim rules,
    reconcile and audit included, with a stand-in that holds and checkpoints the lease without
    dialling an upstream. It changes nothing in production.
    """

    config: WorkerConfig
    store: LeaseStore
    context: ConnectionContext
    holdings: Holdings
    log: Callable[..., None]
    # Called as Connection is: (lease, context, *, acquired_at, on_finished). See above.
    # ``None``: this module's ``Connection``, looked up at each claim, so that the real-time
    # fault simulation's observed subclass, put in its place, is the one that runs.
    connection_factory: Callable[..., Connection] | None = None
    # Releases that failed (DynamoDB out) while this session stayed live: given back at the
    # next reconcile, not left owned-but-not-run until the audit finds them. With each, the
    # stream's own failure if that is why it ended (the retry holds it off too).
    _unreleased: dict[str, tuple[Lease, str | None]] = field(default_factory=dict, init=False)
    # Claims whose outcome is unknown: the store did not answer before the deadline, and the
    # write may have been applied. The row is read at the next reconcile and run if this
    # session owns it; discovery would never name it (its owner is live), and the audit
    # would find it only a minute later.
    _unsure: dict[str, _Unanswered] = field(default_factory=dict, init=False)
    _reconcile_now: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def reconcile_soon(self) -> None:
        """Reconcile now rather than at the next interval."""
        self._reconcile_now.set()

    # -- claiming -------------------------------------------------------------------------------

    def _skip(self, pk: str) -> bool:
        holdings = self.holdings
        shed_at = holdings.recently_shed.get(pk)
        now = self.store.session.clock.monotonic()
        if shed_at is not None and now - shed_at < self.config.rebalance_hold_seconds:
            return True
        holdings.recently_shed.pop(pk, None)
        return pk in holdings.connections

    async def claim(self, candidate: Claimable, via: str) -> bool | None:
        """Try to take ``candidate``. ``True`` taken, ``False`` not claimable (someone else has
        it, or it is gone), ``None`` not attempted (stopping, full, or busy here)."""
        pk = candidate.pk
        holdings = self.holdings
        if (
            holdings.stopping.is_set()
            or self._skip(pk)
            or pk in holdings.busy  # intake, reconcile and the audit may all find it
            or holdings.free_slots() <= 0
        ):
            return None
        holdings.busy.add(pk)
        try:
            leases = self.store.connections
            if candidate.owner is None:
                lease = await leases.acquire(pk, asked=via == "intake")
            else:
                lease = await leases.claim(candidate)
        except Exception as exc:  # one bad candidate must not stop intake or reconcile
            session = self.store.session
            self._unsure[pk] = _Unanswered(
                session.version,
                session.clock.monotonic() + self.config.timing.holder_window_seconds,
            )
            self.log("claim_failed", pk=pk, error=str(exc))
            return None
        finally:
            holdings.busy.discard(pk)
        self._unsure.pop(pk, None)  # answered: whatever an earlier claim did, this one knows
        if lease is None:
            return False
        return await self._run_claimed(lease, via, previous_owner=candidate.owner)

    async def _run_claimed(self, lease: Lease, via: str, *, previous_owner: str | None) -> bool:
        """Run a lease this worker just learned it holds; ``False`` if it was given back (its
        session ended before the claim was answered)."""
        holdings = self.holdings
        leases = self.store.connections
        session = self.store.session
        if lease.session_version != session.version or session.deadline_passed():
            # The claim landed after the session it was made under ended: give it back.
            with contextlib.suppress(Exception):
                if await leases.release(lease):
                    await self.context.notifier.notify(lease.pk)
            self.log("claim_too_late", pk=lease.pk, session_version=lease.session_version)
            return False
        if previous_owner is not None:
            self.log("lease_taken_over", pk=lease.pk, previous_owner=previous_owner)
        holdings.connections[lease.pk] = (self.connection_factory or Connection)(
            lease,
            self.context,
            acquired_at=self.store.session.clock.monotonic(),
            on_finished=self._forget,
        )
        self.log(
            "lease_gained",
            pk=lease.pk,
            via=via,
            lease_version=lease.lease_version,
            last_seq=lease.last_seq,
        )
        if holdings.stopping.is_set():
            holdings.connections[lease.pk].end(EndReason.SHUTDOWN)
        return True

    def _forget(self, connection: Connection) -> None:
        holdings = self.holdings
        if holdings.connections.get(connection.pk) is connection:
            del holdings.connections[connection.pk]
            holdings.capacity_freed.set()
        if connection.abandoned:
            self._unreleased[connection.pk] = (connection.lease, connection.failure)

    def orphan_quota(self, orphans: int) -> int:
        """How many more of ``orphans`` this worker should take (fair share of the fleet as
        last listed, the dead sessions' reported load counted among the orphans)."""
        holdings = self.holdings
        timing = self.config.timing
        now_ms = self.store.session.clock.wall_ms()
        dead_load = sum(
            s.load
            for s in holdings.fleet
            if s.owner != self.config.worker_id
            and self.store.directory.is_expired(s)
            and not s.cleared
        )
        share = fair_share(
            holdings.fleet,
            me=self.config.worker_id,
            mine=len(holdings.connections),
            orphans=max(orphans, dead_load),
            timing=timing,
            now_ms=now_ms,
        )
        return max(0, share - len(holdings.connections))

    # -- reconcile ------------------------------------------------------------------------------

    async def run(self) -> None:
        config = self.config
        # The first run comes within a heartbeat, not a whole interval: until it has listed
        # the fleet, this worker cannot wake for a peer that dies in the meantime.
        delay = random.uniform(0, config.timing.heartbeat_seconds)
        failures = runs = 0
        while True:
            await wait_at_most(self._reconcile_now.wait(), delay)
            self._reconcile_now.clear()
            delay = jittered(config.reconcile_every)
            runs += 1
            try:
                await self._resolve_unsure_claims()
                await self._release_abandoned()
                if runs % AUDIT_EVERY_RECONCILES == 0:
                    await self.audit_own_rows()
                self.holdings.fleet = await self.store.directory.list()
                delay = min(delay, self._until_a_peer_expires())
                if not await self._reconcile():
                    # Left some to peers: look again once their loads are fresher.
                    delay = min(delay, jittered(config.timing.heartbeat_seconds))
                failures = 0
            except (StoreUnavailable, SessionLost) as exc:
                self.log("reconcile_failed", error=str(exc))
                # Again as soon as the store answers, not a whole interval later.
                delay = min(
                    delay, jittered(config.timing.heartbeat_seconds / 4 * 2 ** min(failures, 4))
                )
                failures += 1

    async def _reconcile(self) -> bool:
        """Claim orphans; ``False`` if some were left for peers (fair share), so the caller
        looks again soon."""
        holdings = self.holdings
        free = holdings.free_slots()
        if free <= 0 or self.store.session.deadline_passed():
            return True
        found = await self.store.orphans.discover(free, holdings.fleet)
        clock = self.store.session.clock
        now_ms = clock.wall_ms()
        grace_ms = FAIR_SHARE_GRACE_RECONCILES * self.config.reconcile_every * 1000
        fresh = [c for c, died in found.of_dead_sessions if now_ms - died < grace_ms]
        overdue = [c for c, died in found.of_dead_sessions if now_ms - died >= grace_ms]
        share = fair_share(
            holdings.fleet,
            me=self.config.worker_id,
            mine=len(holdings.connections),
            orphans=len(fresh),
            timing=self.config.timing,
            now_ms=now_ms,
        )
        quota = max(0, share - len(holdings.connections))
        taken = 0
        # In waves of the quota still open: candidates a peer took meanwhile do not count.
        pending = list(fresh)
        while pending and taken < quota:
            wave, pending = pending[: quota - taken], pending[quota - taken :]
            outcomes = await asyncio.gather(*(self.claim(c, "reconcile") for c in wave))
            taken += sum(1 for outcome in outcomes if outcome)
        await asyncio.gather(*(self.claim(c, "reconcile") for c in overdue + found.unowned))
        return not pending

    async def _resolve_unsure_claims(self) -> None:
        """Run the rows whose claim went unanswered if the claim was applied after all: one
        consistent batch read of them."""
        holdings = self.holdings
        session = self.store.session
        if session.version is None:
            return
        for pk, unanswered in list(self._unsure.items()):
            # Its session is over (discovery finds the row once it has expired), or the row
            # runs here, was shed, or is being given back: nothing to resolve.
            if (
                unanswered.session_version != session.version
                or self._skip(pk)
                or pk in self._unreleased
            ):
                del self._unsure[pk]
        pks = [pk for pk in self._unsure if pk not in holdings.busy]
        if not pks:
            return
        holdings.busy.update(pks)
        try:
            items = await self.store.connections.read_many(pks)
        except (StoreUnavailable, SessionLost):
            return  # still out: next time
        finally:
            holdings.busy.difference_update(pks)
        now = session.clock.monotonic()
        for pk in pks:
            unanswered = self._unsure.get(pk)
            if unanswered is None or pk in holdings.connections or pk in holdings.busy:
                continue  # claimed again meanwhile: that claim's answer counts
            item = items.get(pk)
            if not (
                item is not None
                and item.get(model.LEASE_OWNER) == self.config.worker_id
                and item.get(model.LEASE_SESSION) == session.version
            ):
                if now >= unanswered.until:
                    del self._unsure[pk]  # not applied, and no request of it can be any more
                continue
            del self._unsure[pk]
            lease = Lease.from_item(item)
            if holdings.free_slots() > 0:
                await self._run_claimed(lease, "unanswered_claim", previous_owner=None)
            else:  # full meanwhile: given back by the release retries, right after
                self._unreleased[pk] = (lease, None)

    async def _release_abandoned(self) -> None:
        """Retry the releases that failed while this session stayed live."""
        holdings = self.holdings
        session = self.store.session
        for pk, (lease, failure) in list(self._unreleased.items()):
            if pk in holdings.connections or pk in holdings.busy:
                continue  # taken up again meanwhile
            if lease.session_version != session.version:
                del self._unreleased[pk]  # its session is over: orphan discovery takes it
                continue
            holdings.busy.add(pk)
            try:
                offered = await self.store.connections.release(lease, failure=failure)
            except LeaseLost:
                offered = False
            except (StoreUnavailable, SessionLost):
                continue  # still out: next time
            finally:
                holdings.busy.discard(pk)
            del self._unreleased[pk]
            if offered and failure is None:  # a held stream is claimed when its hold ends
                with contextlib.suppress(Exception):
                    await self.context.notifier.notify(pk)
            self.log("lease_released", pk=pk, reason="retried")

    async def audit_own_rows(self) -> None:
        """Release rows this session owns in the table but does not run (a release that failed
        while the session stayed live would otherwise keep them owned until the worker exits)."""
        holdings = self.holdings
        for lease in await self.store.connections.mine():
            pk = lease.pk
            if pk in holdings.connections or pk in holdings.busy:
                continue
            holdings.busy.add(pk)  # no claim of this key while it is being given back
            try:
                offered = await self.store.connections.release(lease)
            except (LeaseLost, StoreUnavailable, SessionLost):
                continue  # the index lagged, or it moved on: nothing to give back
            finally:
                holdings.busy.discard(pk)
            if offered:
                with contextlib.suppress(Exception):
                    await self.context.notifier.notify(pk)
            self.log("lease_released", pk=pk, reason="audit")

    def _until_a_peer_expires(self) -> float:
        """Seconds until the first peer session (as last read) becomes takeable, plus a little.

        A live peer renews long before this; a dead one does not. Waking up right then, instead
        of at the next regular reconcile, brings crash recovery close to the lease itself while
        the regular interval stays long (and cheap).
        """
        timing = self.config.timing
        now_ms = self.store.session.clock.wall_ms()
        waits = [
            (s.expires_at_ms + timing.max_clock_skew_ms - now_ms) / 1000
            for s in self.holdings.fleet
            if s.owner != self.config.worker_id and s.state is model.SessionState.LIVE
        ]
        upcoming = [w for w in waits if w > 0]
        return min(upcoming, default=float("inf")) + random.uniform(0.01, 0.1)

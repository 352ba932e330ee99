"""The worker process: one session, many connections, and the loops that keep them right.

Loops (each a task, each with one job):

* heartbeat: renew the session every ``HEARTBEAT_EVERY``;
* watchdog: at the holder's deadline, end every connection (the holder's promise);
* intake: SQS long polls of 10, claims the batch concurrently, deletes what it handled and
  hands the rest straight back (visibility 0);
* reconcile: every ``RECONCILE_EVERY`` (jittered), when a peer's session becomes takeable, and
  right after a failure or a reopened session: claims orphans, those of a dead peer only up to
  this worker's fair share;
* stop check: one query per interval for "which of mine were stopped?";
* checkpointer: records stored positions (fenced), at most once per interval per connection;
* rebalance: sheds surplus to the fleet when far above average;
* metrics: an EMF document per interval.

SIGTERM ends intake, ends every connection in parallel (flush, release, notify a peer), closes
the session, hands back whatever the last long poll still brings, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import boto3

from .. import emf, model
from ..aws import AsyncClient, ClientSettings
from ..backoff import full_jitter
from ..clock import SYSTEM_CLOCK, Clock
from ..desired_state import DesiredStateWriter
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
from .health import serve_health
from .notifier import Notifier
from .observability import Counters, EventLog, emf_document
from .protocol import JsonSeqProtocol, UpstreamProtocol
from .sink import MessageSink

SQS_VISIBILITY_SECONDS = 30
SHUTDOWN_BUDGET_SECONDS = 10.0
CHECKPOINT_PARALLELISM = 32
ERROR_PAUSE_SECONDS = 0.5
# Once a minute at the default interval: one query of this worker's own rows.
AUDIT_EVERY_RECONCILES = 6
# A dead peer's streams are claimed up to the fair share plus this much (and at least one more):
# the others are left to the peers that reconcile at the same moment.
FAIR_SHARE_SLACK = 0.1
# ...unless they are still unclaimed this long after the peer died (a peer that should have
# taken them may be slow or dead itself): then anyone takes them.
FAIR_SHARE_GRACE_RECONCILES = 2


def jittered(seconds: float) -> float:
    """``seconds`` give or take 20 %, so a fleet's loops drift apart instead of firing together."""
    return seconds * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class WorkerClients:
    """The worker's AWS clients, each with its own bounded pool."""

    dynamodb: AsyncClient
    renewals: AsyncClient  # session renewals only: never queued behind message writes
    sqs: AsyncClient

    @classmethod
    def create(
        cls, config: WorkerConfig, session: boto3.session.Session | None = None
    ) -> WorkerClients:
        """Clients whose read timeouts let a slow-but-working DynamoDB answer within the
        holder's window: the deadline, not a timeout, is what ends connections."""
        window = config.timing.holder_window_seconds
        session = session or boto3.session.Session()
        return cls(
            dynamodb=AsyncClient(
                "dynamodb",
                settings=ClientSettings(threads=32, read_timeout_seconds=window),
                session=session,
            ),
            renewals=AsyncClient(
                "dynamodb",
                settings=ClientSettings(
                    threads=2 * math.ceil(window / config.timing.heartbeat_seconds),
                    connect_timeout_seconds=min(1.0, config.timing.heartbeat_seconds),
                    read_timeout_seconds=window,
                ),
                session=session,
            ),
            sqs=AsyncClient(
                "sqs",
                settings=ClientSettings(
                    threads=4, read_timeout_seconds=config.sqs_wait_seconds + 5
                ),
                session=session,
            ),
        )

    def close(self) -> None:
        for client in (self.dynamodb, self.renewals, self.sqs):
            client.close()


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


class Worker:
    """Owns connections through a session lease; see the module docstring for its loops."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        protocol: UpstreamProtocol | None = None,
        clock: Clock = SYSTEM_CLOCK,
        log: Callable[..., None] | None = None,
        clients: WorkerClients | None = None,
    ):
        self.config = config
        self.log = log or EventLog(config.worker_id)
        timing = config.timing
        self.clients = clients or WorkerClients.create(config)
        self.dynamodb = self.clients.dynamodb
        self.renewals = self.clients.renewals
        self.sqs = self.clients.sqs
        self.store = LeaseStore.create(
            table_name=config.table_name,
            worker_id=config.worker_id,
            timing=timing,
            dynamodb=self.dynamodb,
            renewals=self.renewals,
            clock=clock,
            group=config.session_group,
            region=config.region,
            capacity=config.max_connections,
            task_arn=config.task_arn,
        )
        self.sink = MessageSink(
            dynamodb=self.dynamodb,
            table_name=config.messages_table_name,
            worker_id=config.worker_id,
            session=self.store.session,
            flush_every=config.flush_every,
            retention_seconds=config.message_retention_seconds,
            max_buffered_bytes=config.max_worker_buffered_bytes,
        )
        self.counters = Counters()
        self.context = ConnectionContext(
            leases=self.store.connections,
            sink=self.sink,
            notifier=Notifier(sqs=self.sqs, queue_url=config.queue_url),
            desired_state=DesiredStateWriter(dynamodb=self.dynamodb, table_name=config.table_name),
            policy=config.upstreams,
            protocol=protocol or JsonSeqProtocol(),
            log=self.log,
            counters=self.counters,
            max_message_bytes=config.max_message_bytes,
            max_buffered_messages=config.max_buffered_messages,
            max_buffered_bytes=config.max_buffered_bytes,
            reconnect_base_seconds=config.reconnect_base_seconds,
            reconnect_cap_seconds=config.reconnect_cap_seconds,
        )
        self.connections: dict[str, Connection] = {}
        self.fleet: list[SessionInfo] = []
        # Keys being claimed or audited right now: claim and audit of one key never overlap
        # (an audit that gives a row back while intake adopts it would leave two clients).
        self._busy: set[str] = set()
        # Leases whose release failed (DynamoDB out) while this session stayed live: given back
        # at the next reconcile, not left owned-but-not-run until the audit finds them.
        # Releases that failed while the session stayed live: the lease, and the stream's own
        # failure if that is why it ended (the retry holds it off too).
        self._unreleased: dict[str, tuple[Lease, str | None]] = {}
        self._recently_shed: dict[str, float] = {}
        self._capacity_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._reconcile_now = asyncio.Event()
        self._loops: dict[str, asyncio.Task[None]] = {}
        self.renewal_lateness_max = 0.0
        self.draining = False  # an operator asked this worker to hold nothing

    # -- lifecycle ------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """What SIGTERM and SIGINT do."""
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Open the session, run the loops until asked to stop, then hand everything over."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_shutdown)
        if not await self._open_session():
            await self.shutdown()
            return
        self.log("session_opened", session_version=self.store.session.version)
        loops: dict[str, Callable[[], Awaitable[None]]] = {
            "heartbeat": self._heartbeat_loop,
            "watchdog": self._watchdog_loop,
            "intake": self._intake_loop,
            "reconcile": self._reconcile_loop,
            "stop_check": self._stop_check_loop,
            "checkpointer": self._checkpoint_loop,
            "sink": self.sink.run,
            "rebalance": self._rebalance_loop,
            "metrics": self._metrics_loop,
        }
        if self.config.health_port is not None:
            loops["health"] = lambda: serve_health(
                self.health_report,
                self.config.health_port,
                lambda port: self.log("health_listening", port=port),
            )
        self._loops = {name: asyncio.create_task(run(), name=name) for name, run in loops.items()}
        stopping = asyncio.create_task(self._stopping.wait())
        await asyncio.wait([stopping, *self._loops.values()], return_when=asyncio.FIRST_COMPLETED)
        for name, task in self._loops.items():
            if task.done() and not task.cancelled() and task.exception():
                self.log("loop_failed", loop=name, error=repr(task.exception()))
        stopping.cancel()
        await self.shutdown()

    async def _open_session(self) -> bool:
        """Open the first session, waiting out a DynamoDB that does not answer yet (a worker
        that exits instead only crash-loops through the outage). ``False`` if asked to stop
        first."""
        heartbeat = self.config.timing.heartbeat_seconds
        attempt = 0
        while not self._stopping.is_set():
            try:
                await self.store.session.open()
                return True
            except StoreUnavailable as exc:
                self.log("session_open_failed", error=str(exc))
            await wait_at_most(
                self._stopping.wait(), full_jitter(attempt, heartbeat / 4, 2 * heartbeat)
            )
            attempt += 1
        return False

    async def shutdown(self) -> None:
        """Stop intake, end every connection in parallel (each flushes, releases and notifies a
        peer), close the session. Bounded by ``SHUTDOWN_BUDGET_SECONDS``."""
        started = self.store.session.clock.monotonic()
        self._stopping.set()
        # Intake is not cancelled: its long poll may be in flight and may receive the very
        # notifications this worker is about to publish. It hands back whatever it gets from
        # now on (visibility 0) and ends after that poll.
        for name in ("reconcile", "rebalance", "stop_check"):
            if name in self._loops:
                self._loops[name].cancel()
        ending = list(self.connections.values())
        for connection in ending:
            connection.end(EndReason.SHUTDOWN)
        if ending:
            await asyncio.wait([c.task for c in ending], timeout=SHUTDOWN_BUDGET_SECONDS)
        intake = self._loops.get("intake")
        if intake is not None:
            await asyncio.wait([intake], timeout=self.config.sqs_wait_seconds + 1)
        for task in self._loops.values():
            task.cancel()
        await asyncio.gather(*self._loops.values(), return_exceptions=True)
        await self.store.session.close()
        self.log(
            "worker_stopped",
            handed_over=len(ending),
            seconds=round(self.store.session.clock.monotonic() - started, 3),
            dynamodb_requests=dict(self.dynamodb.requests + self.renewals.requests),
            sqs_requests=dict(self.sqs.requests),
        )
        self.clients.close()

    # -- claiming -------------------------------------------------------------------------------

    def free_slots(self) -> int:
        if self.draining:
            return 0
        return self.config.max_connections - len(self.connections) - len(self._busy)

    def _skip(self, pk: str) -> bool:
        shed_at = self._recently_shed.get(pk)
        now = self.store.session.clock.monotonic()
        if shed_at is not None and now - shed_at < self.config.rebalance_hold_seconds:
            return True
        self._recently_shed.pop(pk, None)
        return pk in self.connections

    async def _claim(self, candidate: Claimable, via: str) -> bool | None:
        """Try to take ``candidate``. ``True`` taken, ``False`` not claimable (someone else has
        it, or it is gone), ``None`` not attempted (stopping, full, or busy here)."""
        pk = candidate.pk
        if (
            self._stopping.is_set()
            or self._skip(pk)
            or pk in self._busy  # intake, reconcile and the audit may all find it
            or self.free_slots() <= 0
        ):
            return None
        self._busy.add(pk)
        try:
            leases = self.store.connections
            if candidate.owner is None:
                lease = await leases.acquire(pk, asked=via == "intake")
            else:
                lease = await leases.claim(candidate)
        except Exception as exc:  # one bad candidate must not stop intake or reconcile
            self.log("claim_failed", pk=pk, error=str(exc))
            return None
        finally:
            self._busy.discard(pk)
        if lease is None:
            return False
        session = self.store.session
        if lease.session_version != session.version or session.deadline_passed():
            # The claim landed after the session it was made under ended: give it back.
            with contextlib.suppress(Exception):
                if await leases.release(lease):
                    await self.context.notifier.notify(lease.pk)
            self.log("claim_too_late", pk=lease.pk, session_version=lease.session_version)
            return False
        if candidate.owner is not None:
            self.log("lease_taken_over", pk=lease.pk, previous_owner=candidate.owner)
        self.connections[lease.pk] = Connection(
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
        if self._stopping.is_set():
            self.connections[lease.pk].end(EndReason.SHUTDOWN)
        return True

    def _forget(self, connection: Connection) -> None:
        if self.connections.get(connection.pk) is connection:
            del self.connections[connection.pk]
            self._capacity_freed.set()
        if connection.abandoned:
            self._unreleased[connection.pk] = (connection.lease, connection.failure)

    def dead_loops(self) -> list[str]:
        """Loops that ended although nothing asked them to (what the health check reports)."""
        return [name for name, task in self._loops.items() if task.done() and name != "health"]

    def health_report(self) -> tuple[int, dict[str, Any]]:
        """What ``GET /health`` answers now: 503 once a loop has died, else 200; with what the
        worker holds."""
        dead = self.dead_loops()
        session = self.store.session
        body = {
            "worker": self.config.worker_id,
            "connections": len(self.connections),
            "session_live": not session.deadline_passed(),
            "session_version": session.version,
            "dead_loops": dead,
        }
        return (503 if dead else 200), body

    def end_all(self, reason: EndReason) -> None:
        for connection in list(self.connections.values()):
            connection.end(reason)

    # -- loops ----------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        session = self.store.session
        clock = session.clock
        heartbeat = self.config.timing.heartbeat_seconds
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
                renewed = await session.renew(load=len(self.connections))
                if session.drain_requested and not self.draining:
                    self.draining = True
                    self.log("draining", connections=len(self.connections))
                    self.end_all(EndReason.HANDOFF)
                if not renewed:
                    self.end_all(EndReason.DEADLINE)
                    self.log(
                        "session_reopened",
                        previous=old_version,
                        session_version=session.version,
                    )
                    self._reconcile_now.set()
            except SessionLost as exc:
                self.end_all(EndReason.LOST)
                self.log("session_lost", error=str(exc))
                with contextlib.suppress(StoreUnavailable):
                    await session.open(load=0)
                    self._reconcile_now.set()
            except StoreUnavailable as exc:
                self.log("renewal_failed", error=str(exc))

    async def _watchdog_loop(self) -> None:
        """The holder's promise: no connection outlives the deadline of its session."""
        session = self.store.session
        while True:
            left = session.seconds_left()
            if left > 0:
                await asyncio.sleep(left)  # renewals only ever move the deadline later
                continue
            if self.connections:
                self.log("deadline_passed", connections=len(self.connections))
                self.end_all(EndReason.DEADLINE)
            await asyncio.sleep(self.config.timing.heartbeat_seconds / 4)

    async def _intake_loop(self) -> None:
        config = self.config
        while not self._stopping.is_set():
            free = self.free_slots()
            if free <= 0:
                self._capacity_freed.clear()
                await wait_at_most(self._capacity_freed.wait(), config.sqs_wait_seconds)
                continue
            if self.store.session.deadline_passed():
                await asyncio.sleep(config.timing.heartbeat_seconds / 2)
                continue
            try:
                response = await self.sqs.call(
                    "receive_message",
                    QueueUrl=config.queue_url,
                    MaxNumberOfMessages=min(10, free),
                    WaitTimeSeconds=config.sqs_wait_seconds,
                    VisibilityTimeout=SQS_VISIBILITY_SECONDS,
                )
            except Exception as exc:
                self.log("intake_failed", error=str(exc))
                await asyncio.sleep(jittered(ERROR_PAUSE_SECONDS))
                continue
            messages = response.get("Messages", [])
            if messages:
                await self._take_in(messages)

    async def _take_in(self, messages: list[dict]) -> None:
        """Claim what the messages announce. Delete each message that was dealt with (claimed,
        or not claimable: the row, not the message, is the truth, and reconcile finds anything
        a lost notification would have announced); hand the others straight back (visibility
        0) so that a peer claims them now rather than after the visibility timeout."""
        by_pk: dict[str, list[dict]] = {}
        handled: list[dict] = []
        orphans: set[str] = set()
        for message in messages:
            try:
                pk = model.parse_notification(message["Body"])
            except ValueError as exc:
                self.log("intake_bad_message", error=str(exc))
                handled.append(message)
                continue
            by_pk.setdefault(pk, []).append(message)
            if model.is_orphan_notification(message["Body"]):
                orphans.add(pk)
        # Orphans of a dead task arrive together: take them only up to this worker's fair share
        # and leave the rest to peers (visible again a second later, so no worker spins on them).
        quota = self._orphan_quota(len(orphans)) if orphans else 0
        over = set(sorted(orphans)[quota:]) if orphans else set()
        wanted = [pk for pk in by_pk if pk not in over]
        outcomes = await asyncio.gather(*(self._claim(Claimable(pk), "intake") for pk in wanted))
        returned: list[dict] = []
        stopping = self._stopping.is_set()
        for pk, outcome in zip(wanted, outcomes, strict=True):
            # Not attempted (stopping, full or busy here): back to the queue. A stopping worker's
            # last long poll may bring its own handoff notifications while those connections
            # are still ending (still in self.connections): they are a peer's to claim.
            if outcome is None and (stopping or pk not in self.connections):
                returned.extend(by_pk[pk])
            else:  # claimed, not claimable, or a duplicate of what this running worker holds
                handled.extend(by_pk[pk])
        await self._sqs_batch("delete_message_batch", handled)
        await self._sqs_batch("change_message_visibility_batch", returned, VisibilityTimeout=0)
        left = [m for pk in over for m in by_pk[pk]]
        await self._sqs_batch("change_message_visibility_batch", left, VisibilityTimeout=1)

    def _orphan_quota(self, orphans: int) -> int:
        """How many more of ``orphans`` this worker should take (fair share of the fleet as
        last listed, the dead sessions' reported load counted among the orphans)."""
        timing = self.config.timing
        now_ms = self.store.session.clock.wall_ms()
        dead_load = sum(
            s.load
            for s in self.fleet
            if s.owner != self.config.worker_id
            and self.store.directory.is_expired(s)
            and not s.cleared
        )
        share = fair_share(
            self.fleet,
            me=self.config.worker_id,
            mine=len(self.connections),
            orphans=max(orphans, dead_load),
            timing=timing,
            now_ms=now_ms,
        )
        return max(0, share - len(self.connections))

    async def _sqs_batch(self, operation: str, messages: list[dict], **entry: int) -> None:
        for start in range(0, len(messages), 10):
            part = messages[start : start + 10]
            try:
                await self.sqs.call(
                    operation,
                    QueueUrl=self.config.queue_url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], **entry}
                        for n, m in enumerate(part)
                    ],
                )
            except Exception as exc:
                self.log("intake_batch_failed", operation=operation, error=str(exc))

    async def _reconcile_loop(self) -> None:
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
                await self._release_abandoned()
                if runs % AUDIT_EVERY_RECONCILES == 0:
                    await self._audit_own_rows()
                self.fleet = await self.store.directory.list()
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
        free = self.free_slots()
        if free <= 0 or self.store.session.deadline_passed():
            return True
        found = await self.store.orphans.discover(free, self.fleet)
        clock = self.store.session.clock
        now_ms = clock.wall_ms()
        grace_ms = FAIR_SHARE_GRACE_RECONCILES * self.config.reconcile_every * 1000
        fresh = [c for c, died in found.of_dead_sessions if now_ms - died < grace_ms]
        overdue = [c for c, died in found.of_dead_sessions if now_ms - died >= grace_ms]
        share = fair_share(
            self.fleet,
            me=self.config.worker_id,
            mine=len(self.connections),
            orphans=len(fresh),
            timing=self.config.timing,
            now_ms=now_ms,
        )
        quota = max(0, share - len(self.connections))
        taken = 0
        # In waves of the quota still open: candidates a peer took meanwhile do not count.
        pending = list(fresh)
        while pending and taken < quota:
            wave, pending = pending[: quota - taken], pending[quota - taken :]
            outcomes = await asyncio.gather(*(self._claim(c, "reconcile") for c in wave))
            taken += sum(1 for outcome in outcomes if outcome)
        await asyncio.gather(*(self._claim(c, "reconcile") for c in overdue + found.unowned))
        return not pending

    async def _release_abandoned(self) -> None:
        """Retry the releases that failed while this session stayed live."""
        session = self.store.session
        for pk, (lease, failure) in list(self._unreleased.items()):
            if pk in self.connections or pk in self._busy:
                continue  # taken up again meanwhile
            if lease.session_version != session.version:
                del self._unreleased[pk]  # its session is over: orphan discovery takes it
                continue
            self._busy.add(pk)
            try:
                offered = await self.store.connections.release(lease, failure=failure)
            except LeaseLost:
                offered = False
            except (StoreUnavailable, SessionLost):
                continue  # still out: next time
            finally:
                self._busy.discard(pk)
            del self._unreleased[pk]
            if offered and failure is None:  # a held stream is claimed when its hold ends
                with contextlib.suppress(Exception):
                    await self.context.notifier.notify(pk)
            self.log("lease_released", pk=pk, reason="retried")

    async def _audit_own_rows(self) -> None:
        """Release rows this session owns in the table but does not run (a release that failed
        while the session stayed live would otherwise keep them owned until the worker exits)."""
        for lease in await self.store.connections.mine():
            pk = lease.pk
            if pk in self.connections or pk in self._busy:
                continue
            self._busy.add(pk)  # no claim of this key while it is being given back
            try:
                offered = await self.store.connections.release(lease)
            except (LeaseLost, StoreUnavailable, SessionLost):
                continue  # the index lagged, or it moved on: nothing to give back
            finally:
                self._busy.discard(pk)
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
            for s in self.fleet
            if s.owner != self.config.worker_id and s.state is model.SessionState.LIVE
        ]
        upcoming = [w for w in waits if w > 0]
        return min(upcoming, default=float("inf")) + random.uniform(0.01, 0.1)

    async def _stop_check_loop(self) -> None:
        stopped = model.DesiredState.STOPPED.value
        clock = self.store.session.clock
        due = clock.monotonic()
        while True:
            # Fixed rate, not fixed delay: the time a check takes does not stretch the period,
            # so a STOP is seen within one STOP_CHECK_EVERY.
            due += self.config.stop_check_every
            await asyncio.sleep(max(0.0, due - clock.monotonic()))
            due = max(due, clock.monotonic() - self.config.stop_check_every)
            try:
                flagged = [
                    pk
                    for pk in await self.store.connections.stop_requested()
                    if pk in self.connections
                ]
                if not flagged:
                    continue
                # The index may lag; confirm with one consistent batched read.
                items = await self.store.connections.read_many(flagged)
            except (StoreUnavailable, SessionLost) as exc:
                self.log("stop_check_failed", error=str(exc))
                continue
            for pk in flagged:
                item, connection = items.get(pk), self.connections.get(pk)
                if (
                    connection is not None
                    and item is not None
                    and item.get(model.DESIRED_STATE) == stopped
                    and item.get(model.LEASE_VERSION) == connection.lease.lease_version
                ):
                    connection.end(EndReason.STOPPED)

    async def _checkpoint_loop(self) -> None:
        limit = asyncio.Semaphore(CHECKPOINT_PARALLELISM)

        async def checkpoint(connection: Connection) -> None:
            async with limit:
                with contextlib.suppress(SessionLost, StoreUnavailable):
                    await connection.checkpoint()

        while True:
            await asyncio.sleep(self.config.checkpoint_every)
            due = [c for c in self.connections.values() if c.stored_seq > c.checkpointed_seq]
            await asyncio.gather(*(checkpoint(c) for c in due))

    async def _rebalance_loop(self) -> None:
        config = self.config
        while True:
            await asyncio.sleep(jittered(config.rebalance_every))
            surplus = self.surplus()
            if surplus <= 0:
                continue
            now = self.store.session.clock.monotonic()
            movable = sorted(
                (
                    c
                    for c in self.connections.values()
                    if now - c.acquired_at >= config.rebalance_hold_seconds and c.end_reason is None
                ),
                key=lambda c: c.acquired_at,
                reverse=True,
            )[: min(surplus, config.rebalance_max_per_interval)]
            if movable:
                self.log("rebalancing", shedding=len(movable), holding=len(self.connections))
            for connection in movable:
                self._recently_shed[connection.pk] = now
                connection.end(EndReason.HANDOFF)

    def surplus(self) -> int:
        """How many connections above the fleet's average (plus tolerance) this worker holds."""
        directory = self.store.directory
        mine = len(self.connections)
        peers = [
            s
            for s in self.fleet
            if s.owner != self.config.worker_id and not directory.is_expired(s)
        ]
        if not peers:
            return 0
        # Connections shed lately may not show in the peers' reported load yet; counting them
        # keeps a stale view from shedding twice.
        now = self.store.session.clock.monotonic()
        settling = 2 * self.config.timing.heartbeat_seconds + self.config.reconcile_every
        in_flight = sum(1 for at in self._recently_shed.values() if now - at < settling)
        average = (mine + in_flight + sum(s.load for s in peers)) / (len(peers) + 1)
        if mine <= average * (1 + self.config.rebalance_tolerance) or mine - average < 2:
            return 0
        return int(mine - average)

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_every)
            self.emit_metrics()

    def emit_metrics(self) -> None:
        document = emf_document(self.config.service_name, len(self.connections), self.counters)
        emf.write(emf.line(document))
        self.counters.reset()
        self.log(
            "worker_stats",
            connections=len(self.connections),
            messages_stored=self.sink.stored_total,
            renewal_lateness_max_ms=round(self.renewal_lateness_max * 1000, 1),
            dynamodb_requests=dict(self.dynamodb.requests + self.renewals.requests),
            sqs_requests=dict(self.sqs.requests),
        )

"""The world one schedule runs in: the stores, the code under test, what was stored and
posted."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from streamfleet import model
from streamfleet.lease.dynamo import to_attr
from streamfleet.worker.sink import MessageSink
from streamfleet.wsapi.handlers.subscribe import REPLAY_MAX_BYTES
from streamfleet_dev.dsim.greenlets import Killed, Scheduler, Task
from streamfleet_dev.dsim.live.aws import FLEET_SDK, SimDynamoDB
from streamfleet_dev.dsim.live.region import PRIMARY, SECONDARY, Region
from streamfleet_dev.dsim.live.replication import Replication
from streamfleet_dev.dsim.live.schedule import GROUPS, Schedule

WALL_BASE_MS = 1_800_000_000_000
SETTLE_S = 400.0  # the quiet period: the quiet watch (20 s, doubling to 320 s) finds lost tails
# The message data one handler invocation may post: a subscribe's replay budget, which its
# first message may exceed alone (at most 400 KB, DynamoDB's item limit, so never here).
REPLAYED_DATA_BOUND = REPLAY_MAX_BYTES


# --- The world ----------------------------------------------------------------------------------


@dataclass
class Stored:
    """One message as the log holds it, and when it was (first) stored."""

    position: int
    data: str
    json: bool
    stored_at_ms: int
    expired: bool = False  # deleted by TTL at some point of the run


@dataclass
class Posted:
    """What one connection was sent: each message position with when it was posted."""

    user: str
    token_expires_at: int
    region: Region
    positions: list[tuple[str, int, int]] = field(default_factory=list)  # stream, position, ms


class World:
    """Everything one schedule runs, on one scheduler and one seeded generator."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.rng = random.Random(f"world-{schedule.seed}")
        self.scheduler = Scheduler(WALL_BASE_MS)
        self.clock = self.scheduler.clock
        self.trace: list[str] = []
        self.problems: list[str] = []
        self.requests = 0
        # The message data (UTF-8 bytes, before escaping) posted by each handler invocation.
        self.replayed_bytes: dict[Task, int] = defaultdict(int)
        self.faults = 0
        self.faults_on = True
        self.log: dict[str, dict[int, Stored]] = defaultdict(dict)
        self.posted: dict[str, Posted] = {}  # by connection id
        # The fleet, the control plane and the failover name's first answer are the primary
        # Region's; a schedule with a failover has a second Region, fed by replication.
        self.primary = Region(self, PRIMARY, connection_prefix="c")
        self.regions = [self.primary]
        self.secondary: Region | None = None
        self.replication: Replication | None = None  # the fleet's global tables
        # The state table, written by the handlers of either Region: one way each.
        self.state_replication: dict[str, Replication] = {}
        if schedule.failover is not None:
            self.secondary = Region(self, SECONDARY, connection_prefix="d")
            self.regions.append(self.secondary)
            self.replication = Replication(self, self.primary, self.secondary)
            self.state_replication = {
                PRIMARY: Replication(
                    self,
                    self.primary,
                    self.secondary,
                    tables=("state",),
                    stream_name="replication-state",
                ),
                SECONDARY: Replication(
                    self,
                    self.secondary,
                    self.primary,
                    tables=("state",),
                    stream_name="replication-state-back",
                ),
            }
        self.names = self.primary.names
        self.sink = MessageSink(
            dynamodb=None,  # type: ignore[arg-type]  # only its item format is used
            table_name=self.names["messages"],
            worker_id="w1",
            session=None,  # type: ignore[arg-type]
            flush_every=1.0,
            retention_seconds=schedule.retention_s,
        )
        self.worker_db = SimDynamoDB(self, "worker", FLEET_SDK, self.primary)
        self.control_db = SimDynamoDB(self, "control", FLEET_SDK, self.primary)
        self.readers = Readers(self)
        self.upstreams: dict[str, Any] = {}  # by stream: each one's Upstream (actors)
        self._removals = self.primary.store.stream_records(self.names["messages"])
        self._removals_read = 0

    def region_for(self, user: str) -> Region:
        """The Region ``user``'s client reaches now: the failover name, resolved at every
        attempt (after a failover, the secondary), or the secondary's own URL if it is pinned
        there."""
        failover = self.schedule.failover
        if self.secondary is not None and failover is not None and user in failover.pinned:
            return self.secondary
        return self.region_answering()

    def region_answering(self) -> Region:
        """The Region the failover name answers with now."""
        failover = self.schedule.failover
        if self.secondary is not None and failover is not None:
            return self.secondary if failover.on_secondary(self.scheduler.now) else self.primary
        return self.primary

    # Lambda ----------------------------------------------------------------------------------

    def invoke(
        self,
        function: Callable[[Any, Any], Any],
        event: Any,
        *,
        timeout: float,
        name: str,
        crash_after: float | None = None,
    ) -> tuple[bool, Any]:
        """One invocation, in a task of its own: ``(True, its answer)``, or ``(False, None)``
        when it raised, crashed after ``crash_after`` seconds, or ran into its timeout (a
        problem once faults have ended: the work of each invocation is bounded to fit it)."""
        scheduler = self.scheduler
        task = scheduler.spawn(
            function,
            event,
            _Context(self, scheduler.now + timeout),
            name=name,
            detached=False,
        )
        timers = [scheduler.spawn(self._time_out, task, timeout, name=f"{name}-timeout")]
        if crash_after is not None:
            timers.append(
                scheduler.spawn(scheduler.kill, task, name=f"{name}-crash", delay=crash_after)
            )
        try:
            return True, task.join()
        except Killed:
            if scheduler.current().killed:
                raise  # the caller itself was killed, not only its invocation
            return False, None
        except Exception as exc:  # Lambda retries what its event source gives it again
            self.note(f"{name} raised {type(exc).__name__}: {exc}")
            return False, None
        finally:
            for timer in timers:
                scheduler.kill(timer)

    def _time_out(self, task: Task, timeout: float) -> None:
        self.scheduler.sleep(timeout)
        if not task.done:
            # With faults, lost answers cost their read timeouts: Lambda ends the invocation
            # and its caller recovers. One begun after faults ended must never take that long.
            began_without_faults = self.scheduler.now - timeout >= self.schedule.duration
            report = self.problem if began_without_faults else self.note
            report(f"{task.name} ran past its {timeout:g} s timeout")
            self.scheduler.kill(task)

    # Time and chance -------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        return self.clock.wall_ms()

    def latency(self) -> float:
        """One hop's time: mostly milliseconds, now and then a slow one, rarely a stall of
        seconds (a paused host, a congested link) while faults last."""
        draw = self.rng.random()
        if draw < 0.01 and self.faults_on:
            return self.rng.uniform(1.0, 3.0)
        if draw < 0.06:
            return self.rng.uniform(0.05, 0.5)
        return self.rng.uniform(0.001, 0.02)

    def lose_answer(self) -> bool:
        return self._fault(self.schedule.lost_answers)

    def throttle(self) -> bool:
        return self._fault(self.schedule.throttles)

    def _fault(self, share: float) -> bool:
        if self.faults_on and self.rng.random() < share:
            self.faults += 1
            return True
        return False

    def subscribing(self, stream: str, group: str) -> None:
        """A client sends a subscribe: now and then the adversary excludes its group from the
        stream's readers while that subscribe is handled (for a while), or stores a message
        too big for one frame then."""
        if self._fault(self.schedule.racing_changes):
            pause, length = self.rng.uniform(0.0, 0.1), self.rng.uniform(0.2, 3.0)
            self.scheduler.spawn(
                self.readers.exclude_for, stream, group, length, name="racing-readers", delay=pause
            )
        if self._fault(self.schedule.racing_writes):
            self.scheduler.spawn(
                self.upstreams[stream].store_large,
                name="racing-write",
                delay=self.rng.uniform(0.0, 0.1),
            )

    def note(self, text: str) -> None:
        self.trace.append(f"{self.scheduler.now:10.4f} {text}")

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.note(f"PROBLEM {text}")

    # What was stored -------------------------------------------------------------------------

    def applied(self, region: Region, operation: str, params: dict[str, Any]) -> None:
        """Called as a write is applied in ``region``: the messages table's log, kept for the
        checker; a write to a global table is replicated."""
        state_replication = self.state_replication.get(region.name)
        if state_replication is not None:
            state_replication.carry(operation, params)
        if not region.primary:
            return  # only the primary's fleet and control plane write the global tables
        if self.replication is not None:
            self.replication.carry(operation, params)
        if operation != "put_item" or params.get("TableName") != self.names["messages"]:
            return
        item = params["Item"]
        stream = model.connection_id_of(item[model.PK]["S"])
        position = int(item[model.SEQ]["N"])
        data = item[model.MESSAGE_DATA]["S"]
        is_json = model.MESSAGE_FORMAT in item
        held = self.log[stream].get(position)
        if held is not None:
            if (held.data, held.json) != (data, is_json):
                self.problem(f"{stream}: position {position} stored with different data")
            return
        self.log[stream][position] = Stored(position, data, is_json, self.now_ms)

    def expire(self, now_s: float) -> None:
        """TTL deletes what expired before ``now_s``; the log marks what it deleted, from the
        change stream's ``REMOVE`` records (as a reader of the stream would learn it)."""
        for region in self.regions[1:]:
            region.store.expire(now_s)  # each replica's own TTL deletes what expired there
        deleted = self.primary.store.expire(now_s)
        if not deleted:
            return
        records = self._removals()
        for record in records[self._removals_read :]:
            keys = record["dynamodb"]["Keys"]
            if record["eventName"] != "REMOVE" or model.SEQ not in keys:
                continue
            stream = model.connection_id_of(keys[model.PK]["S"])
            stored = self.log[stream].get(int(keys[model.SEQ]["N"]))
            if stored is not None:
                stored.expired = True
        self._removals_read = len(records)
        self.note(f"TTL deleted {deleted} items")

    def connected(
        self, connection_id: str, user: str, token_expires_at: int, region: Region
    ) -> None:
        self.posted[connection_id] = Posted(user, token_expires_at, region)

    def on_post(self, connection_id: str, data: bytes) -> int:
        """Record the message positions a frame posted to a connection; the bytes of message
        data it carries."""
        try:
            frame = json.loads(data)
        except ValueError:
            return 0
        if not isinstance(frame, dict) or frame.get("type") != model.WS_REPLY_MESSAGES:
            return 0
        entries = frame.get("messages") or ()
        posted = self.posted.get(connection_id)
        if posted is not None:
            for entry in entries:
                position = model.log_position(int(entry.get("epoch", 0)), int(entry["seq"]))
                posted.positions.append((str(frame["stream"]), position, self.now_ms))
        return sum(len(str(entry.get("data", "")).encode("utf-8")) for entry in entries)


def until_answered(call: Callable[[], Any]) -> Any:
    """``call()`` again until it is answered: how the sink writes a message and the REST API's
    caller retries a START (each a write that may be applied twice, on purpose)."""
    while True:
        try:
            return call()
        except (ClientError, ReadTimeoutError):
            continue


class Readers:
    """Each stream's readers as START writes them, one write at a time (each computed from what
    is excluded when it is sent, so none lands over a later one), and the windows in which a
    group surely could not read: from an exclusion's answer to its lifting's request."""

    def __init__(self, world: World):
        self._world = world
        self._excluded: dict[str, Counter[str]] = defaultdict(Counter)
        self._busy = False

    def start(self) -> None:
        world = self._world
        # The START is a readers write too: a change raced with an early subscribe waits for it,
        # or the START, answered later (throttled, retried), would land over that change.
        self._busy = True
        try:
            for stream in world.schedule.streams:
                until_answered(
                    lambda stream=stream: world.control_db.put_item(
                        TableName=world.names["streams"],
                        Item={
                            model.PK: to_attr(model.connection_pk(stream)),
                            model.READERS: to_attr(list(GROUPS)),
                            model.ORIGIN_SEQ: to_attr(0),
                        },
                    )
                )
        finally:
            self._busy = False

    def exclude_for(self, stream: str, group: str, seconds: float) -> None:
        self.change(stream, group, exclude=True)
        self._world.scheduler.sleep(seconds)
        self.change(stream, group, exclude=False)

    def change(self, stream: str, group: str, *, exclude: bool) -> None:
        world = self._world
        while self._busy:
            world.scheduler.sleep(0.005)
        self._busy = True
        try:
            held = self._excluded[stream]
            held[group] += 1 if exclude else -1
            windows = world.primary.excluded.setdefault((stream, group), [])
            if not exclude and held[group] == 0:
                windows[-1] = (windows[-1][0], world.now_ms)
            until_answered(
                lambda: world.control_db.update_item(
                    TableName=world.names["streams"],
                    Key={model.PK: to_attr(model.connection_pk(stream))},
                    UpdateExpression="SET #r = :r",
                    ExpressionAttributeNames={"#r": model.READERS},
                    ExpressionAttributeValues={":r": to_attr([g for g in GROUPS if not held[g]])},
                )
            )
            if exclude and held[group] == 1:
                # Applied before this answer arrived: what is stored from now on is after it.
                windows.append((world.now_ms, None))
            world.note(f"readers of {stream} {'exclude' if exclude else 'include again'} {group}")
        finally:
            self._busy = False

    def replicated(self, region: Region, stream: str, readers: list[str]) -> None:
        """A stream's readers as they reached ``region``'s replica, now: the windows in which
        that Region surely excluded a group run from the replicated exclusion to the replicated
        lifting (what another Region's fan-out and handlers read is its own replica)."""
        now = self._world.now_ms
        for group in GROUPS:
            windows = region.excluded.setdefault((stream, group), [])
            open_window = bool(windows) and windows[-1][1] is None
            if group not in readers and not open_window:
                windows.append((now, None))
            elif group in readers and open_window:
                windows[-1] = (windows[-1][0], now)


class _Context:
    """A Lambda context's remaining time, on the virtual clock."""

    def __init__(self, world: World, deadline: float):
        self._world = world
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._world.scheduler.now) * 1000))

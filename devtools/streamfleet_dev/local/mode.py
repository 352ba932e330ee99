"""``make local``: the whole system on this machine, from the synthesized assembly, live.

What runs (each piece what ``cdk deploy`` would run, read from the cloud assembly that
``cdk synth`` writes; :mod:`streamfleet_dev.assembly` caches it by its inputs):

* dynalite for the lease table, moto's server for the messages table (its DynamoDB stream
  feeds live delivery) and SQS, behind one routing DynamoDB endpoint
  (:mod:`~streamfleet_dev.local.stores`; ``--dynamodb moto`` puts every table on moto), the
  fleet's tables created from the synthesized templates, and its queue;
* the event REST API: the template's methods served on a local port, each request a REST proxy
  event for the event router running from its synthesized asset in a clean interpreter
  (:class:`~streamfleet_dev.emulator.lambda_runner.LambdaProcess`);
* the fake upstream, and N worker processes started as ECS starts the task definition's
  container (its command, the image's code and interpreter, the container's environment), each
  in a local task: when one exits, ECS's ``STOPPED`` event goes to the task-events handler
  from its asset, which ends its session at once (``--no-task-events``: the lease alone);
* the client-facing WebSocket API in two local regions with their canaries, alarms and failover
  resolver (:class:`~streamfleet_dev.wsapi.regions.LocalRegions`, in a process of its own),
  with live delivery (each region's fan-out from its synthesized asset on its messages table's
  stream, the replica in the secondary), serving the demo page built into ``clients/web/dist``
  (``make web``), whose stream panel watches a stream live;
* twelve STARTed streams (every development token's group may read them), and a live view of
  workers, streams, regions, lease events and ECS's task events.

Type a command and Enter while it runs (what you type shows at the bottom)::

    k 2   kill -9 worker 2          t 2   SIGTERM worker 2 (hand over, exit)
    p 2   pause worker 2 (SIGSTOP)  c 2   continue worker 2 (SIGCONT)
    d 2   drain worker 2            a     add a worker
    s ID  START stream ID           x ID  STOP stream ID
    f     fail the primary region (throttled; "f down": down)   r   restore it
    i     show every URL and the operator CLI's environment     q   quit (Ctrl-C too)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from streamfleet import model
from streamfleet.lease import LeaseTiming, SessionDirectory
from streamfleet.lease.dynamo import from_item, to_attr
from streamfleet_dev.assembly import default_assembly
from streamfleet_dev.emulator.aws_proxy import DEFAULT_INDEX_LAG_SECONDS, DEFAULT_THROTTLE_RATE
from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV, LOCAL_RUN_VARIABLE
from streamfleet_dev.emulator.websocket_gateway import management_fault_rates
from streamfleet_dev.upstream.process import UpstreamProcess
from streamfleet_dev.wsapi.e2e import READER_CLAIM, READER_GROUP
from streamfleet_dev.wsapi.regions import LiveSettings, RegionsSettings
from streamfleet_ops.cli import checkpoint_of, connection_rows

from .fleet import Fleet, WorkerProcess, worker_container
from .reaper import Reaper
from .services import EventApi, RegionsProcess, start_event_api
from .stores import LocalStores, replica_name, start_stores
from .terminal import Keyboard, LineEditor
from .view import (
    Entry,
    EventLog,
    RegionsView,
    SessionView,
    Snapshot,
    StreamView,
    WorkerView,
    lease_text,
    moves_text,
    render,
    task_event_text,
)

REPO = Path(__file__).resolve().parents[3]
DEFAULT_STATIC_DIR = REPO / "clients" / "web" / "dist"
DEFAULT_ENV_FILE = Path(tempfile.gettempdir()) / "streamfleet-local.env"
# Slow enough to watch, fast enough that a kill -9 recovers while you look.
DEMO_TIMING = {
    "LEASE_SECONDS": "4",
    "HEARTBEAT_EVERY": "1",
    "MAX_CLOCK_SKEW_SECONDS": "0.25",
    "SAFETY_MARGIN_SECONDS": "0.25",
    # Reconcile also claims what an ended session held: with the task events, a kill -9
    # recovers within about a second of it even when the dead worker's pending long poll
    # swallowed the handler's first notifications (they come again after 1.5 s).
    "RECONCILE_EVERY": "1",
    "STOP_CHECK_EVERY": "1",
    "CHECKPOINT_EVERY": "0.5",
    "SQS_WAIT_SECONDS": "1",
    "METRICS_EVERY": "5",
}
SKEW_SECONDS = float(DEMO_TIMING["MAX_CLOCK_SKEW_SECONDS"])
SNAPSHOT_EVERY = 1.0  # seconds between reads of the tables, the upstream and the regions
FRAME_EVERY = 0.25  # seconds between redraws (and at once after every key)
SIGNAL_NAMES = {signal.SIGKILL: "kill -9", signal.SIGTERM: "SIGTERM", signal.SIGSEGV: "SIGSEGV"}
# Who may watch the STARTed streams: the group every local development token carries.
STREAM_READERS = (f"{READER_CLAIM}:{READER_GROUP}",)
# How often each region's event source polls an idle stream (Lambda: about 4 times a second).
EVENT_SOURCE_POLL = 0.25
RECOVERY_LOG_WAIT = 10.0  # seconds after a kill to wait for the takers' log lines


def start_worker(fleet: Fleet) -> WorkerProcess:
    """One more worker from the task definition, in a task of its own (when the fleet has task
    events, its exit sends ECS's STOPPED event)."""
    worker_id = f"w{len(fleet.workers) + 1}"
    return fleet.start_worker(worker_id, **fleet.task_env(worker_id))


@dataclass
class Recovery:
    """A worker killed from the view, until every stream it held is owned by a peer."""

    worker_id: str
    killed_at: float  # epoch seconds
    streams: frozenset[str]
    lease_allows_at: float | None  # epoch seconds: its session's expiry plus the skew allowance


GAINS_KEPT = 8  # gains remembered per stream: enough for a takeover and the moves after it

# --- The running system -------------------------------------------------------------------------


@dataclass
class LocalMode:
    """The running system, what the person did to it, and how to read it for the view."""

    fleet: Fleet
    api_url: str
    regions: RegionsProcess | None = None
    stores: LocalStores | None = None
    events: EventLog = field(default_factory=EventLog)
    paused: set[str] = field(default_factory=set)
    terminated: set[str] = field(default_factory=set)
    latest: Snapshot | None = None
    info: str = ""
    show_info: bool = False
    last_result: str = ""
    recoveries: list[Recovery] = field(default_factory=list)
    _offsets: dict[Path, int] = field(default_factory=dict)
    _health: dict[str, Any] = field(default_factory=dict)
    _deliveries_seen: int = 0
    # (owner, version) of each session seen ended by a STOPPED event -> its events-panel line,
    # and what its worker held when it was killed from the view (None: it was not)
    _ended: dict[tuple[str, int], tuple[Entry, Recovery | None]] = field(default_factory=dict)
    # stream -> its last few gains read from the workers' logs, oldest first: (worker, epoch
    # seconds of the lease_gained, or of the lease_taken_over before it)
    _gains: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    _taking: dict[tuple[str, str], float] = field(default_factory=dict)  # takeovers not yet gained

    # -- actions ------------------------------------------------------------------------------

    def post_event(self, body: dict[str, str]) -> str:
        request = urllib.request.Request(
            f"{self.api_url}/events",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return f"{response.status} {json.load(response).get('outcome')}"
        except urllib.error.HTTPError as error:
            answer = json.load(error)
            return f"{error.code} {answer.get('error') or answer.get('message')}"

    def start(self, stream_id: str) -> str:
        """START through the event REST API, naming the readers (any local user may watch)."""
        url = self.fleet.upstream.url_for(stream_id)
        return self.post_event(
            {
                "event_type": "START",
                "connection_id": stream_id,
                "ws_url": url,
                "readers": list(STREAM_READERS),
            }
        )

    def stop(self, stream_id: str) -> str:
        return self.post_event({"event_type": "STOP", "connection_id": stream_id})

    def worker(self, name: str) -> WorkerProcess | None:
        name = name.strip()
        return self.fleet.workers.get(name if name.startswith("w") else f"w{name}")

    async def drain(self, worker_id: str) -> str:
        """What ``cli drain`` does: the drain flag on the worker's live session."""
        directory = SessionDirectory(
            dynamodb=self.fleet.async_dynamodb,
            table_name=self.fleet.lease_table,
            timing=LeaseTiming(),
        )
        asked = await directory.request_drain(worker_id)
        return f"drain asked of {worker_id}" if asked else f"no live session of {worker_id}"

    async def command(self, line: str) -> str:
        """Carry out one typed command; returns what happened (shown and logged)."""
        verb, _, argument = line.strip().partition(" ")
        argument = argument.strip()
        signals = {"k": signal.SIGKILL, "t": signal.SIGTERM, "p": signal.SIGSTOP}
        if verb == "i":
            self.show_info = not self.show_info
            return "showing every URL (i again: the fleet)" if self.show_info else "the fleet"
        if verb == "a":
            started = await asyncio.to_thread(start_worker, self.fleet)
            return f"added {started.worker_id} (pid {started.process.pid})"
        if verb == "s" and argument:
            return f"START {argument}: {await asyncio.to_thread(self.start, argument)}"
        if verb == "x" and argument:
            return f"STOP {argument}: {await asyncio.to_thread(self.stop, argument)}"
        if verb in ("f", "r"):
            if self.regions is None:
                return "the WebSocket regions are not running (--no-regions)"
            if verb == "f":
                mode = argument or "throttled"
                answer = await asyncio.to_thread(self.regions.fail, mode)
                if "error" in answer:
                    return f"fail: {answer['error']}"
                return f"primary {self.regions.primary} {mode}: watch the page move"
            await asyncio.to_thread(self.regions.restore)
            return f"primary {self.regions.primary} restored (fail-back after 3 healthy runs)"
        if verb in (*signals, "c", "d"):
            worker = self.worker(argument) if argument else None
            if worker is None or not worker.alive():
                return f"no running worker {argument or '(give its number)'}"
            if verb == "d":
                return await self.drain(worker.worker_id)
            signum = signals.get(verb, signal.SIGCONT)
            # What a worker to be killed holds, read before the kill (one scan, a few ms):
            # after it, its STOPPED event may already have ended its session and moved them.
            before = await asyncio.to_thread(self._items) if verb == "k" else None
            if verb != "p":
                worker.signal(signal.SIGCONT)  # a paused worker cannot act on SIGTERM
            worker.signal(signum)
            (self.paused.add if verb == "p" else self.paused.discard)(worker.worker_id)
            if verb == "t":
                self.terminated.add(worker.worker_id)
            if before is not None:
                self._watch_recovery(worker.worker_id, time.time(), before)
            names = {"k": "kill -9", "t": "SIGTERM", "p": "SIGSTOP", "c": "SIGCONT"}
            return f"{names[verb]} {worker.worker_id}"
        return f"unknown command {line.strip()!r}: see the help line"

    # -- reading the system -------------------------------------------------------------------

    def _watch_recovery(self, worker_id: str, killed_at: float, items: list[dict]) -> None:
        """Remember what a killed worker held (``items``: the table just before the kill) and
        when its lease alone would let its streams move."""
        held = frozenset(
            model.connection_id_of(item[model.PK])
            for item in items
            if item[model.PK].startswith(model.CONNECTION_PREFIX)
            and item.get(model.LEASE_OWNER) == worker_id
        )
        live = [
            item
            for item in items
            if item[model.PK].startswith(model.SESSION_PREFIX)
            and item.get(model.SESSION_OWNER) == worker_id
            and item.get(model.SESSION_STATE) == model.SessionState.LIVE.value
        ]
        newest = max(live, key=lambda i: int(i[model.SESSION_VERSION]), default=None)
        allows = (
            int(newest[model.EXPIRES_AT_MS]) / 1000 + SKEW_SECONDS if newest is not None else None
        )
        if held:
            self.recoveries.append(Recovery(worker_id, killed_at, held, allows))

    def _note_task_events(self) -> None:
        """One events-panel line per STOPPED event delivered since the last snapshot."""
        ecs = self.fleet.ecs
        if ecs is None:
            return
        new = ecs.deliveries[self._deliveries_seen :]
        self._deliveries_seen += len(new)
        for delivery in new:
            containers = delivery.event.get("detail", {}).get("containers") or [{}]
            text, important = task_event_text(
                delivery.worker_id or "?",
                matched=delivery.matched,
                result=delivery.result if isinstance(delivery.result, dict) else None,
                error=delivery.error,
                exit_code=containers[0].get("exitCode"),
                ms=(delivery.answered_at - delivery.exited_at) * 1000,
            )
            answered = delivery.wall + (delivery.answered_at - delivery.exited_at)
            self.events.note(text, ts=answered, important=important)

    def _note_ended_sessions(self, sessions: dict[tuple[str, int], SessionView]) -> None:
        """A line as soon as a session is seen ended by ECS's STOPPED event (the handler's own
        answer comes seconds later: it announces the streams again after 1.5 s).

        The table is read a moment after the end, and a taker's log a moment after its gain,
        so the line is kept just before the first takeover of what the worker held (which the
        end made possible), however late that takeover is read."""
        for key, session in sessions.items():
            if not session.ended_by_task_event or key in self._ended:
                continue
            worker = self.fleet.workers.get(session.owner)
            code = worker.process.returncode if worker is not None else None
            exit_text = "" if code is None else f" (exit {128 - code if code < 0 else code})"
            recovery = next((r for r in self.recoveries if r.worker_id == session.owner), None)
            entry = self.events.note(
                f"{session.owner}'s session ended by its STOPPED event{exit_text}"
            )
            self._ended[key] = (entry, recovery)
        for entry, recovery in self._ended.values():
            if recovery is None:
                continue
            # Every gain, not the last one: a later move (a rebalance) may be read in the same
            # snapshot as the takeover it followed.
            gains = (gain for stream in recovery.streams for gain in self._gains.get(stream, ()))
            entry.ts = min(
                [
                    entry.ts,
                    *(
                        at - 0.001
                        for worker, at in gains
                        if worker != recovery.worker_id and at >= recovery.killed_at
                    ),
                ]
            )

    def _note_recoveries(self, connections: list[dict[str, Any]]) -> None:
        """Once every stream a killed worker held is owned by a peer (or stopped): how long
        that took after the kill, next to what the lease alone would have allowed."""
        rows = {model.connection_id_of(i[model.PK]): i for i in connections}
        for recovery in list(self.recoveries):
            pending = [
                stream
                for stream in recovery.streams
                if stream in rows
                and rows[stream].get(model.DESIRED_STATE) == "STARTED"
                and rows[stream].get(model.LEASE_OWNER) in (None, recovery.worker_id)
            ]
            if pending:
                continue
            started = [s for s in recovery.streams if s in rows and rows[s].get(model.LEASE_OWNER)]
            seen = []
            for stream in started:
                taker, at = self._gains.get(stream, [("", 0.0)])[-1]
                if taker != recovery.worker_id and at >= recovery.killed_at:
                    seen.append(at)
            if len(seen) < len(started) and time.time() < recovery.killed_at + RECOVERY_LOG_WAIT:
                continue  # owned by a peer whose log line is not read yet
            self.recoveries.remove(recovery)
            done_at = max(seen, default=time.time())
            took = max(0.0, done_at - recovery.killed_at)
            count = len(recovery.streams)
            # Short: it must fit 80 columns after its time.
            text = (
                f"{recovery.worker_id}'s {count} stream{'' if count == 1 else 's'} moved "
                f"{took:.1f} s after the kill"
            )
            if recovery.lease_allows_at is not None:
                lease = recovery.lease_allows_at - recovery.killed_at
                text += f" (lease alone: {max(0.0, lease):.1f} s)"
            self.events.note(text, ts=done_at)

    def _tail(self, worker: WorkerProcess) -> None:
        offset = self._offsets.get(worker.log_path, 0)
        try:
            with open(worker.log_path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offsets[worker.log_path] = offset + len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if line.startswith('{"ts"'):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    self.events.add(record)
                    pk = str(record.get("pk") or "")
                    if not pk.startswith(model.CONNECTION_PREFIX):
                        continue
                    key = (worker.worker_id, model.connection_id_of(pk))
                    if record.get("event") == "lease_taken_over":
                        self._taking[key] = float(record["ts"])
                    if record.get("event") == "lease_gained":
                        at = self._taking.pop(key, float(record["ts"]))
                        gains = self._gains.setdefault(key[1], [])
                        gains.append((worker.worker_id, at))
                        del gains[:-GAINS_KEPT]

    def _items(self) -> list[dict[str, Any]]:
        pages = self.fleet.dynamodb.get_paginator("scan").paginate(TableName=self.fleet.lease_table)
        return [from_item(raw) for page in pages for raw in page["Items"]]

    def _newest_stored(self, pks: list[str]) -> dict[str, int]:
        """The newest stored seq of each stream (one descending Query of one item each, as
        ``cli connections --messages-table`` reads it)."""
        found = {}
        for pk in pks:
            page = self.fleet.dynamodb.query(
                TableName=self.fleet.messages_table,
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": model.PK, "#seq": model.SEQ},
                ExpressionAttributeValues={":pk": to_attr(pk)},
                ProjectionExpression="#seq",
                ScanIndexForward=False,
                Limit=1,
            )
            if page.get("Items"):
                found[pk] = int(page["Items"][0][model.SEQ]["N"])
        return found

    def _regions_view(self) -> tuple[RegionsView | None, str]:
        if self.regions is None:
            return None, "not running (--no-regions)"
        try:
            health = self.regions.health()
        except (OSError, ValueError) as exc:
            return None, f"no answer from {self.regions.http_url} ({exc})"
        previous, self._health = self._health, health
        if previous and previous.get("serving") != health.get("serving"):
            self.events.note(
                f"the failover name now points at {health.get('serving')} "
                "(the page reconnects there)"
            )
        if previous and previous.get("primary") != health.get("primary"):
            self.events.note(f"primary {self.regions.primary} is {health.get('primary')}")
        view = RegionsView(
            primary=self.regions.primary,
            secondary=self.regions.secondary,
            primary_mode=str(health.get("primary", "?")),
            secondary_mode=str(health.get("secondary", "?")),
            serving=str(health.get("serving", "?")),
            alarms=health.get("alarms") or {},
        )
        return view, ""

    def snapshot(self) -> Snapshot:
        """Everything the view shows, read from the table, the upstream, the regions and the
        logs (blocking: call it in a thread)."""
        for worker in list(self.fleet.workers.values()):
            self._tail(worker)
        self._note_task_events()
        now_ms = time.time_ns() // 1_000_000
        items = self._items()
        connections = [i for i in items if i[model.PK].startswith(model.CONNECTION_PREFIX)]
        sessions: dict[tuple[str, int], SessionView] = {}
        for item in items:
            if item[model.PK].startswith(model.SESSION_PREFIX):
                session = SessionView(
                    owner=item[model.SESSION_OWNER],
                    version=int(item[model.SESSION_VERSION]),
                    state=str(item.get(model.SESSION_STATE, "")),
                    expires_at_ms=int(item.get(model.EXPIRES_AT_MS, 0)),
                    drain_requested=bool(item.get(model.DRAIN_REQUESTED)),
                    ended_by=str(item.get(model.SESSION_ENDED_BY) or ""),
                )
                sessions[(session.owner, session.version)] = session
        self._note_ended_sessions(sessions)
        self._note_recoveries(connections)
        newest: dict[str, SessionView] = {}
        for key in sorted(sessions):  # by owner, then version: the newest one wins
            newest[key[0]] = sessions[key]
        stored = self._newest_stored([i[model.PK] for i in connections])
        rows = {r["connection_id"]: r for r in connection_rows(connections, now_ms, stored)}
        head = self.fleet.upstream.stats()["head"]
        owned: dict[str, int] = {}
        for item in connections:
            if item.get(model.LEASE_OWNER):
                owned[item[model.LEASE_OWNER]] = owned.get(item[model.LEASE_OWNER], 0) + 1
        workers = [
            self._worker_view(worker, newest.get(worker.worker_id), owned, now_ms)
            for worker in self.fleet.workers.values()
        ]
        for owner, session in newest.items():  # workers started by hand, say
            live = session.state == model.SessionState.LIVE.value
            if owner not in self.fleet.workers and live and session.seconds_left(now_ms) > -60:
                workers.append(
                    WorkerView(
                        owner,
                        None,
                        "running" if session.seconds_left(now_ms) > 0 else "silent",
                        owned.get(owner, 0),
                        lease_text(session, now_ms),
                        "started elsewhere",
                    )
                )
        streams = []
        for item in sorted(connections, key=lambda i: i[model.PK]):
            stream_id = model.connection_id_of(item[model.PK])
            owner = item.get(model.LEASE_OWNER)
            session = (
                sessions.get((owner, int(item.get(model.LEASE_SESSION, -1)))) if owner else None
            )
            owner_state = self._owner_state(owner, session, now_ms) if owner else ""
            note = ""
            if owner_state:
                note = moves_text(session, now_ms, SKEW_SECONDS)
            elif item.get(model.REFUSED_REASON):
                note = f"refused: {item[model.REFUSED_REASON]}"
            elif item.get(model.DESIRED_STATE) == "STARTED" and not owner:
                note = "waiting for a worker"
            streams.append(
                StreamView(
                    stream_id=stream_id,
                    desired=str(item.get(model.DESIRED_STATE, "")),
                    owner=owner,
                    owner_state=owner_state,
                    checkpoint=model.split_position(checkpoint_of(item))[1],
                    stored=rows[stream_id]["stored_seq"],
                    lag=rows[stream_id]["lag"],
                    upstream=head.get(stream_id),
                    note=note,
                )
            )
        regions, regions_error = self._regions_view()
        return Snapshot(
            at=time.time(),
            workers=tuple(workers),
            streams=tuple(streams),
            regions=regions,
            regions_error=regions_error,
        )

    def _owner_state(self, owner: str, session: SessionView | None, now_ms: int) -> str:
        """Why a stream's owner no longer holds it in practice ("" while it does)."""
        worker = self.fleet.workers.get(owner)
        if worker is not None and not worker.alive():
            return "dead"
        if owner in self.paused:
            return "paused"
        if session is None:
            return "" if worker is None else "ended"
        if session.state != model.SessionState.LIVE.value:
            return "ended"
        return "expired" if session.seconds_left(now_ms) < 0 else ""

    def _worker_view(
        self,
        worker: WorkerProcess,
        session: SessionView | None,
        owned: dict[str, int],
        now_ms: int,
    ) -> WorkerView:
        holds = owned.get(worker.worker_id, 0)
        returncode = worker.process.poll()
        lease = lease_text(session, now_ms)
        if returncode is not None:
            if returncode < 0:
                state = f"dead ({SIGNAL_NAMES.get(-returncode, signal.Signals(-returncode).name)})"
            else:
                state = "stopped" if returncode == 0 else f"exited {returncode}"
            note = moves_text(session, now_ms, SKEW_SECONDS, streams=holds) if holds else ""
            return WorkerView(worker.worker_id, worker.process.pid, state, None, lease, note)
        note = ""
        if worker.worker_id in self.paused:
            state = "paused"
            note = "renews nothing: its streams move"
        elif worker.worker_id in self.terminated:
            state = "stopping"
        elif session is not None and session.drain_requested:
            state = "draining" if holds else "drained"
        else:
            state = "running"
        return WorkerView(worker.worker_id, worker.process.pid, state, holds, lease, note)


# --- Start-up, the banner, the loop -------------------------------------------------------------


def live_settings(fleet: Fleet, stores: LocalStores) -> LiveSettings:
    """Live delivery for the regions: the fleet's lease table, its messages table on moto and
    the secondary's replica named after it (both routed to moto by the proxy), the streams on
    moto, every development token in the readers' group."""
    secondary = RegionsSettings().secondary
    return LiveSettings(
        lease_table=fleet.lease_table,
        messages_tables=(fleet.messages_table, replica_name(fleet.messages_table, secondary)),
        streams_endpoint=stores.streams_endpoint,
        reader_claims=(READER_CLAIM,),
        poll_interval=EVENT_SOURCE_POLL,
        token_claims=((READER_CLAIM, (READER_GROUP,)),),
    )


def environment_lines(mode: LocalMode) -> dict[str, str]:
    """What the operator CLI (and a worker run by hand) needs in a second terminal."""
    fleet = mode.fleet
    return {
        "AWS_ENDPOINT_URL_DYNAMODB": os.environ["AWS_ENDPOINT_URL_DYNAMODB"],
        "AWS_ENDPOINT_URL_SQS": os.environ["AWS_ENDPOINT_URL_SQS"],
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": os.environ["AWS_DEFAULT_REGION"],
        model.ENV_TABLE_NAME: fleet.lease_table,
        model.ENV_MESSAGES_TABLE_NAME: fleet.messages_table,
        model.ENV_QUEUE_URL: fleet.queue_url,
        model.ENV_ALLOWED_UPSTREAMS: f"ws://127.0.0.1:{fleet.upstream.port}",
    }


def banner(
    mode: LocalMode, assembly_dir: Path, env_file: Path, streams: tuple[str, ...] = ()
) -> str:
    """Every URL a person needs, and the environment of a second terminal (plain text, one
    ``export`` per line, so it can be copied or sourced)."""
    upstream = f"ws://127.0.0.1:{mode.fleet.upstream.port}"
    _, container, _ = worker_container()
    lines = ["StreamFleet on this machine, from the synthesized assembly:", f"  {assembly_dir}"]
    if mode.regions is not None:
        page = mode.regions.http_url
        served = DEFAULT_STATIC_DIR if (DEFAULT_STATIC_DIR / "index.html").is_file() else None
        lines += [
            f"demo page:      {page}/?user=alice   and   {page}/?user=bob"
            + ("" if served else "   (not built: run make web)"),
        ]
        if streams:
            choices = streams[0] if len(streams) == 1 else f"{streams[0]} to {streams[-1]}"
            lines += [
                f"watch a stream: {page}/?user=alice&stream={streams[0]}   (or pick one of "
                f"{choices} in the page's stream panel: its messages arrive live, with their seqs)",
            ]
        lines += [
            f"WebSocket API:  {mode.regions.region_url(mode.regions.primary)} "
            f"({mode.regions.primary}, primary)",
            f"                {mode.regions.region_url(mode.regions.secondary)} "
            f"({mode.regions.secondary}, secondary)",
            f"failover name:  GET {page}/resolve   (tokens: GET {page}/token?user=alice)",
            f"fail / restore: type f / r, or curl -X POST {page}/fail?mode=throttled "
            f"and {page}/restore",
        ]
    lines += [
        f"event REST API: POST {mode.api_url}/events   GET {mode.api_url}/connections/<id>",
        f"fake upstream:  {upstream}/streams/<id>",
        f"workers:        {' '.join(container.argv())} in the image's code "
        "(the task definition's container)",
    ]
    lines += [
        "",
        f"In a second terminal (or: source {env_file}):",
    ]
    lines += [f"export {name}={value}" for name, value in environment_lines(mode).items()]
    lines += [
        f'make cli ARGS="start my-1 {upstream}/streams/my-1"',
        'make cli ARGS="connections"        # owner, checkpoint, lag in messages',
        ".venv/bin/python -m streamfleet.worker   # one more worker, by hand (lease 20 s)",
    ]
    # After the exports: the info screen (i) at 24 rows still shows them.
    if mode.fleet.ecs is not None:
        lines.append(
            "task events:    a worker's exit sends ECS's STOPPED event to the task-events handler "
            "(from its asset): its session ends at once, peers claim its streams"
        )
    else:
        lines.append(
            "task events:    off (--no-task-events): a killed worker's streams wait for its lease"
        )
    if mode.stores is not None and mode.stores.dynalite is not None:
        lines.append(
            f"DynamoDB:       {mode.stores.dynamodb_endpoint} routes by table: leases on dynalite "
            f"{mode.stores.dynalite.endpoint}, messages on moto {mode.stores.moto.endpoint} "
            "(with its stream)"
        )
    return "\n".join(lines)


def _api_answers(api_url: str) -> bool:
    try:
        urllib.request.urlopen(f"{api_url}/connections/probe", timeout=1).close()
    except urllib.error.HTTPError:
        return True  # a 404 for the probe is an answer
    except OSError:
        return False
    return True


async def _wait_for_api(api_url: str) -> None:
    for _ in range(100):
        if await asyncio.to_thread(_api_answers, api_url):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the local event API at {api_url} did not start")


async def _refresh(mode: LocalMode, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        try:
            mode.latest = await asyncio.to_thread(mode.snapshot)
        except Exception as exc:  # a server restarting: say so, keep the view alive
            mode.last_result = f"could not read the system: {exc}"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), SNAPSHOT_EVERY)


async def run(args: argparse.Namespace, workdir: Path) -> None:
    console = Console()

    def say(message: str) -> None:
        console.print(f"[dim]local:[/dim] {message}", highlight=False)

    logging.basicConfig(filename=workdir / "local-mode.log", level=logging.WARNING)
    logging.captureWarnings(True)
    os.environ.update(LOCAL_AWS_ENV)
    started_at = time.monotonic()
    stores: LocalStores | None = None
    upstream: UpstreamProcess | None = None
    fleet: Fleet | None = None
    event_api: EventApi | None = None
    regions: RegionsProcess | None = None
    # Ctrl-C, SIGTERM and a closed terminal or tmux window (SIGHUP) all stop everything this
    # started, in order: its servers run in sessions of their own (so a Ctrl-C reaches only
    # this process, and no terminal's signal cuts a worker's handover short). What this cannot
    # stop (kill -9, a crash) dies with it all the same: every child gets SIGKILL from the
    # kernel when this process ends (lifeline.py), and the reaper stops whatever carries this
    # run's mark after that (reaper.py). During start-up a signal stops it between two
    # steps (a step runs in a thread, which cancelling could not stop: what it started would
    # be lost to the clean-up); during the live view it ends the view.
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(number, stopping.set)

    def go_on() -> None:
        if stopping.is_set():
            raise StartupStopped

    try:
        say(
            "starting moto (SQS, the messages table and its stream) and dynalite (leases), "
            "one DynamoDB endpoint over both"
            if args.dynamodb == "dynalite"
            else "starting moto (SQS and DynamoDB)"
        )
        stores = await asyncio.to_thread(
            start_stores,
            workdir,
            leases_on=args.dynamodb,
            index_lag_seconds=args.index_lag,
            throttle_rate=args.throttle,
        )
        go_on()
        os.environ["AWS_ENDPOINT_URL_SQS"] = stores.sqs_endpoint
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = stores.dynamodb_endpoint
        say("reading the cloud assembly (cdk synth, about 15 s when an input changed)")
        assembly = await asyncio.to_thread(default_assembly)
        go_on()
        say("the worker image's interpreter (its requirements.txt, installed once)")
        await asyncio.to_thread(worker_container)
        go_on()
        upstream = UpstreamProcess(rate=args.rate, keepalive_seconds=1.0)
        await asyncio.to_thread(upstream.start)
        go_on()
        if not args.no_task_events:
            say("ECS's task events: the task-events handler from its asset")
        fleet = await asyncio.to_thread(
            Fleet,
            endpoint=stores.dynamodb_endpoint,
            upstream=upstream,
            tmp=workdir,
            extra_env=DEMO_TIMING,
            task_events=not args.no_task_events,
            own_sessions=True,  # they die with this process all the same (lifeline.py)
        )
        go_on()
        stream_ids = tuple(f"s{n:02d}" for n in range(args.streams))
        say("the event router from its asset (and the Lambda runtime's boto3, once)")
        event_api = await asyncio.to_thread(
            start_event_api, fleet, f"ws://127.0.0.1:{upstream.port}", workdir / "router.log"
        )
        go_on()
        if not args.no_regions:
            say(
                "the WebSocket API in two local regions, canaries and failover resolver, "
                "live delivery (each region's fan-out from its asset on its messages stream)"
            )
            static_dir = args.static_dir if (args.static_dir / "index.html").is_file() else None
            regions = RegionsProcess(
                static_dir=static_dir,
                log_path=workdir / "regions.log",
                live=live_settings(fleet, stores),
                dynamodb_endpoint=stores.dynamodb_endpoint,
                streams=stream_ids,
                management_fault_rates=management_fault_rates(args.throttle),
            )
            await asyncio.to_thread(regions.start)
            go_on()
        mode = LocalMode(fleet=fleet, api_url=event_api.url, regions=regions, stores=stores)
        say(f"{args.workers} workers from the task definition, {args.streams} STARTs")
        for _ in range(args.workers):
            await asyncio.to_thread(start_worker, fleet)
            go_on()
        await _wait_for_api(event_api.url)
        for stream_id in stream_ids:
            go_on()
            outcome = await asyncio.to_thread(mode.start, stream_id)
            mode.events.note(f"START {stream_id}: {outcome}", important=False)
        mode.info = banner(mode, assembly.directory, args.env_file, stream_ids)
        args.env_file.write_text(
            "".join(f"export {k}={v}\n" for k, v in environment_lines(mode).items())
        )
        # Plain print: one line per export, never re-wrapped, so it can be copied.
        print(mode.info, flush=True)
        say(f"up in {time.monotonic() - started_at:.1f} s; the live view follows")
        if args.banner_pause:
            await asyncio.sleep(args.banner_pause)
        await _live(mode, console, stopping, args)
        if args.summary:
            _print_summary(mode)
    finally:
        # Each step on its own: after a SIGHUP the terminal is gone (writing to it fails) and
        # one failed stop must not leave the servers after it running.
        with contextlib.suppress(OSError):
            console.print("shutting down: workers hand over, then everything stops")
        if fleet is not None:
            _quietly(lambda: _hand_over(fleet))
        for part in (event_api, regions, upstream, stores):
            if part is not None:
                _quietly(part.stop)
        with contextlib.suppress(OSError):
            if args.env_file.is_file():
                args.env_file.unlink()


def _hand_over(fleet: Fleet) -> None:
    workers = list(fleet.workers.values())
    try:
        for worker in workers:
            if worker.alive():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGTERM)
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.process.wait(15)
    finally:
        fleet.close()


class StartupStopped(Exception):
    """A signal arrived while local mode was starting; what had started was stopped."""


def _quietly(step: Callable[[], object]) -> None:
    try:
        step()
    except Exception:
        logging.getLogger(__name__).exception("local mode: a stop step failed")


async def _live(
    mode: LocalMode, console: Console, stopping: asyncio.Event, args: argparse.Namespace
) -> None:
    """The live view until q, Ctrl-C or ``--duration``: rich's screen mode (the alternate
    screen, redrawn in place), every section capped to the terminal's height."""
    loop = asyncio.get_running_loop()
    editor = LineEditor()
    lines: asyncio.Queue[str] = asyncio.Queue()
    wake = asyncio.Event()

    def on_key(key: str) -> None:
        line = editor.feed(key)
        if line is not None:
            lines.put_nowait(line)
        wake.set()

    keyboard = Keyboard(loop, on_key).start()
    refresher = loop.create_task(_refresh(mode, stopping))
    header = (
        f"demo page {mode.regions.http_url}/?user=alice (and ?user=bob) · i: every URL"
        if mode.regions is not None
        else f"event API {mode.api_url}/events · i: every URL"
    )
    if mode.fleet.ecs is None:
        header += " · task events off"
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        with Live(console=console, screen=True, auto_refresh=False, transient=False) as live:
            while not stopping.is_set() and (deadline is None or time.monotonic() < deadline):
                while not lines.empty():
                    line = lines.get_nowait()
                    if not line.strip():
                        continue
                    if line.strip() == "q":
                        stopping.set()
                        break
                    try:
                        result = await mode.command(line)
                    except Exception as exc:  # a command that failed must not end the view
                        result = f"{line.strip()}: failed: {exc}"
                    mode.last_result = result
                    mode.events.note(f"> {line.strip()}: {result}")
                frame = render(
                    mode.latest,
                    mode.events,
                    header=header,
                    typed=editor.text,
                    last_result=mode.last_result,
                    height=console.size.height,
                    info=mode.info if mode.show_info else None,
                )
                live.update(frame, refresh=True)
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), FRAME_EVERY)
    except OSError:  # the terminal is gone (closed, its tmux session killed): EIO on a write
        return
    finally:
        keyboard.restore()
        stopping.set()
        await asyncio.gather(refresher, return_exceptions=True)
    # After the alternate screen: the last frame, in full, for the scrollback (off a terminal,
    # Live printed it already).
    if mode.latest is not None and console.is_terminal:
        with contextlib.suppress(OSError):
            console.print(
                render(
                    mode.latest,
                    mode.events,
                    header=header,
                    typed="",
                    last_result=mode.last_result,
                    height=max(console.size.height, 12 + len(mode.latest.streams)),
                )
            )


def _print_summary(mode: LocalMode) -> None:
    snapshot = mode.snapshot()
    print(
        json.dumps(
            {
                "streams": {
                    s.stream_id: {
                        "state": s.desired,
                        "owner": s.owner,
                        "checkpoint": s.checkpoint,
                        "lag": s.lag,
                    }
                    for s in snapshot.streams
                },
                "workers": {w.worker_id: w.state for w in snapshot.workers},
                "events": mode.events.lines(50),
            }
        ),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--rate", type=float, default=2.0, help="upstream messages per second")
    # dynalite by default: moto's server does not serialise concurrent conditional writes.
    parser.add_argument("--dynamodb", choices=("moto", "dynalite"), default="dynalite")
    parser.add_argument("--duration", type=float, default=0, help="seconds; 0 = until quit")
    parser.add_argument(
        "--index-lag",
        type=float,
        default=DEFAULT_INDEX_LAG_SECONDS,
        help="seconds an index query's answer may be stale (DynamoDB's GSIs are eventually "
        "consistent; 0: never)",
    )
    parser.add_argument(
        "--throttle",
        type=float,
        default=DEFAULT_THROTTLE_RATE,
        help="the fraction of DynamoDB item and query requests and of Management API calls "
        "answered as throttled (0: none)",
    )
    parser.add_argument("--summary", action="store_true", help="print a JSON summary at the end")
    parser.add_argument(
        "--reaper-log",
        type=Path,
        default=None,
        help="where the reaper says what it found left after local mode ended (default: the "
        "run's temporary directory, which an orderly stop removes)",
    )
    parser.add_argument(
        "--no-regions", action="store_true", help="without the WebSocket API's two regions"
    )
    parser.add_argument(
        "--no-task-events",
        action="store_true",
        help="no ECS STOPPED events when a worker exits: a kill -9 recovers by the lease alone",
    )
    parser.add_argument(
        "--static-dir",
        type=Path,
        default=DEFAULT_STATIC_DIR,
        help="the demo page's files (make web builds them)",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        default=DEFAULT_ENV_FILE,
        help="where to write the second terminal's exports (removed at exit)",
    )
    parser.add_argument(
        "--banner-pause",
        type=float,
        default=0,
        help="seconds to leave the banner on screen before the live view",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.streams < 0 or args.rate <= 0:
        parser.error("--workers must be ≥ 1, --streams ≥ 0, --rate > 0")
    if not 0 <= args.index_lag <= 60:
        parser.error("--index-lag: from 0 to 60 seconds")
    if not 0 <= args.throttle <= 0.5:
        parser.error("--throttle: a fraction from 0 to 0.5")
    # Everything started from here on carries this run's mark (never an inherited one: another
    # run's processes are not ours to stop); the reaper stops what is left of it once this
    # process has gone, whether it stopped in order or was killed.
    token = os.environ[LOCAL_RUN_VARIABLE] = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="streamfleet-local-") as tmp:
        reaper = Reaper(token, args.reaper_log or Path(tmp) / "reaper.log").start()
        try:
            asyncio.run(run(args, Path(tmp)))
        except StartupStopped:
            return 130
        finally:
            reaper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The live view of ``make local``: what it shows, computed from a snapshot, sized to the screen.

Pure functions and small classes, no I/O: :mod:`~streamfleet_dev.local.mode` reads the tables,
the upstream, the regions and the worker processes into a :class:`Snapshot`, feeds the
workers' JSON log records to an :class:`EventLog`, and renders both with :func:`render` for a
terminal of any size: every section is capped so that the whole view fits (80 x 24 included)
and rich's screen mode redraws it in place.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from streamfleet import model

HELP = (
    "k N kill -9 · t N SIGTERM · p/c N pause/continue · d N drain · a add worker · "
    "s/x ID start/stop · f [down] fail primary region · r restore · i URLs · q quit"
)

# Events that explain what happened to a stream or a worker: always kept on screen before
# routine ones (a dozen lease_lost lines must not push a deadline_passed out of view).
IMPORTANT_EVENTS = frozenset(
    {
        "lease_taken_over",
        "lease_handed_over",
        "deadline_passed",
        "session_reopened",
        "session_lost",
        "draining",
        "worker_stopped",
        "rebalancing",
    }
)
ROUTINE_EVENTS = frozenset(
    {"lease_gained", "lease_released", "lease_lost", "session_opened", "claim_too_late"}
)
COALESCE_SECONDS = 2.0  # events of one kind by one worker this close together share a line
CONTEXT_SECONDS = 10.0  # a lease_lost this soon after its worker's deadline says so
MAX_ENTRIES = 500
STALE_SECONDS = 3.0  # a snapshot older than this says how old it is


# --- The snapshot -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionView:
    """A worker's newest session item."""

    owner: str
    version: int
    state: str  # LIVE | ENDED
    expires_at_ms: int
    drain_requested: bool = False
    ended_by: str = ""  # who ended it (model.SESSION_ENDED_BY): a peer's fence, ECS's event...

    @property
    def ended_by_task_event(self) -> bool:
        return self.ended_by.startswith(model.ENDED_BY_TASK_STOPPED)

    def seconds_left(self, now_ms: int) -> float:
        return (self.expires_at_ms - now_ms) / 1000


@dataclass(frozen=True)
class WorkerView:
    """One row of the workers table."""

    worker_id: str
    pid: int | None  # None: a worker this local mode did not start (a hand-run one)
    state: str  # running, paused, stopping, draining, drained, dead (kill -9), exited 0, ...
    connections: int | None  # None when it holds nothing (dead, exited)
    lease: str  # "3.2 s left", "expired 0.4 s ago", "ended", "-"
    note: str = ""

    @property
    def dead(self) -> bool:
        return self.state.startswith("dead")


@dataclass(frozen=True)
class StreamView:
    """One row of the streams table. ``lag`` is the CLI's: messages stored past the checkpoint
    (newest stored seq minus the checkpoint); ``upstream`` the fake upstream's newest seq."""

    stream_id: str
    desired: str
    owner: str | None
    owner_state: str  # "", "dead", "paused", "expired", "ended"
    checkpoint: int | None
    stored: int | None
    lag: int | None
    upstream: int | None
    note: str = ""

    @property
    def needs_attention(self) -> bool:
        return bool(self.owner_state or self.note) or (
            self.desired == "STARTED" and self.owner is None
        )


@dataclass(frozen=True)
class RegionsView:
    """The WebSocket API's two local regions, from ``GET /health``."""

    primary: str
    secondary: str
    primary_mode: str  # healthy | throttled | down
    secondary_mode: str
    serving: str
    alarms: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame shows."""

    at: float
    workers: tuple[WorkerView, ...]
    streams: tuple[StreamView, ...]
    regions: RegionsView | None = None
    regions_error: str = ""


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f} s"


def lease_text(session: SessionView | None, now_ms: int) -> str:
    """How long a worker's session has left, as the workers table shows it."""
    if session is None:
        return "-"
    if session.state != model.SessionState.LIVE.value:
        return "ended (STOPPED)" if session.ended_by_task_event else "ended"
    left = session.seconds_left(now_ms)
    if left >= 0:
        return f"{format_seconds(left)} left"
    return f"expired {format_seconds(-left)} ago"


def moves_text(
    session: SessionView | None, now_ms: int, skew_seconds: float, *, streams: int = 1
) -> str:
    """When streams held by a worker that no longer runs become takeable: its session's expiry
    plus the clock-skew allowance (the taker's rule). ``streams`` > 1 says how many."""
    subject = "moves" if streams == 1 else f"{streams} streams move"
    if session is None:
        return f"{subject} at the next reconcile"
    if session.state != model.SessionState.LIVE.value:
        return f"{subject} now (its session ended)"  # fenced: takeable at once
    left = session.seconds_left(now_ms) + skew_seconds
    return f"{subject} in {format_seconds(left)}" if left > 0 else f"{subject} now"


# --- Events -------------------------------------------------------------------------------------


def task_event_text(
    worker: str,
    *,
    matched: bool,
    result: Mapping[str, Any] | None,
    error: str | None,
    exit_code: int | None,
    ms: float,
) -> tuple[str, bool]:
    """The events-panel line for one ECS ``STOPPED`` event the local fleet delivered to the
    task-events handler, once the handler answered (``ms`` after the exit), and whether it
    matters: a session it ended is said as soon as it is seen, so that answer is routine."""
    code = "" if exit_code is None else f"exit {exit_code}, "
    if not matched:
        return f"{worker}'s STOPPED event did not match the fleet's rule", True
    if error:
        return f"{worker}'s STOPPED event: the handler failed ({error[:80]})", True
    result = result or {}
    decision = result.get("decision")
    if decision == "acted":
        notified = int(result.get("notified") or 0)
        text = f"{worker}'s STOPPED event handled: {notified} stream{'' if notified == 1 else 's'}"
        after = result.get("notified_after_ms")
        text += " announced to peers" + (f" {float(after):.0f} ms in" if after is not None else "")
        again = int(result.get("notified_again") or 0)
        return text + (f", {again} again later" if again else "") + f" ({ms / 1000:.1f} s)", False
    if decision == "unchanged":
        # A SIGTERM handoff that finished, or a lease that lapsed first: nothing left to end.
        why = "its session was over" if result.get("sessions") else "it had no session"
        return f"{worker}'s STOPPED event ({code}nothing to end: {why})", False
    return f"{worker}'s STOPPED event ignored ({result.get('reason', decision)})", True


@dataclass
class Entry:
    """One line of the events panel (several coalesced events of one kind and worker)."""

    ts: float
    worker: str
    kind: str
    text: str  # "took over {streams} from w2": {streams} is filled in when rendered
    important: bool
    streams: list[str] = field(default_factory=list)
    key: tuple[Any, ...] = ()

    def line(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.ts))
        body = self.text.replace("{streams}", " ".join(self.streams))
        who = f"{self.worker} " if self.worker else ""
        return f"{when} {who}{body}".rstrip()


class EventLog:
    """The events panel: workers' lease events and what the person did, deduplicated.

    A takeover is one line (``lease_taken_over``; the ``lease_gained`` that follows it for the
    same stream is not shown again); events of one kind from one worker within
    :data:`COALESCE_SECONDS` share a line listing their streams; a ``lease_lost`` shortly after
    its worker's ``deadline_passed`` or ``session_reopened`` says so. :meth:`lines` keeps the
    important events before routine ones when space is short.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._taken: set[tuple[str, str]] = set()  # (worker, pk) whose lease_gained to skip
        self._last_trouble: dict[str, tuple[float, str]] = {}

    def note(self, text: str, *, ts: float | None = None, important: bool = True) -> Entry:
        """Something the person did or the regions did (a typed command, a failover)."""
        entry = Entry(ts=ts or time.time(), worker="", kind="note", text=text, important=important)
        self._append(entry)
        return entry

    def add(self, record: Mapping[str, Any]) -> Entry | None:
        """One JSON log record of a worker; returns the entry it made or joined (or None)."""
        event = record.get("event")
        if event not in IMPORTANT_EVENTS and event not in ROUTINE_EVENTS:
            return None
        worker = str(record.get("worker", "?"))
        ts = float(record.get("ts") or time.time())
        pk = str(record.get("pk") or "")
        stream = model.connection_id_of(pk) if pk.startswith(model.CONNECTION_PREFIX) else ""
        reason = str(record.get("reason") or "")
        if event == "lease_gained" and (worker, pk) in self._taken:
            self._taken.discard((worker, pk))
            return None
        if event == "lease_taken_over":
            self._taken.add((worker, pk))
            previous = record.get("previous_owner") or "?"
            return self._join(ts, worker, event, f"took over {{streams}} from {previous}", stream)
        if event == "lease_gained":
            via = record.get("via") or ""
            return self._join(ts, worker, event, "gained {streams}" + _paren(via), stream, via)
        if event == "lease_handed_over":
            return self._join(
                ts, worker, event, "handed over {streams}" + _paren(reason), stream, reason
            )
        if event == "lease_released":
            return self._join(
                ts, worker, event, "released {streams}" + _paren(reason), stream, reason
            )
        if event == "lease_lost":
            trouble = self._last_trouble.get(worker)
            why = trouble[1] if trouble and ts - trouble[0] <= CONTEXT_SECONDS else ""
            return self._join(ts, worker, event, "lost {streams}" + _paren(why), stream, why)
        if event == "claim_too_late":
            return self._join(ts, worker, event, "claimed {streams} too late, gave it back", stream)
        if event == "deadline_passed":
            self._last_trouble[worker] = (ts, "after its deadline passed")
            count = record.get("connections", "?")
            text = f"deadline passed: dropped {count} connections (no renewal in time)"
        elif event == "session_reopened":
            self._last_trouble[worker] = (ts, "session reopened")
            text = "session lapsed (no renewal in time): opened a new one"
        elif event == "session_lost":
            self._last_trouble[worker] = (ts, "session lost")
            text = "session lost" + _paren(str(record.get("error") or ""))
        elif event == "session_opened":
            text = "session opened"
        elif event == "draining":
            text = f"draining: handing over {record.get('connections', '?')} connections"
        elif event == "worker_stopped":
            text = "stopped"
        else:  # rebalancing
            shed, held = record.get("shedding", "?"), record.get("holding", "?")
            text = f"rebalancing: shedding {shed} of {held}"
        entry = Entry(
            ts=ts, worker=worker, kind=event, text=text, important=event in IMPORTANT_EVENTS
        )
        self._append(entry)
        return entry

    def _join(
        self, ts: float, worker: str, kind: str, text: str, stream: str, *detail: str
    ) -> Entry:
        key = (worker, kind, *detail)
        for entry in reversed(self.entries[-6:]):
            if entry.key == key and ts - entry.ts <= COALESCE_SECONDS:
                if stream and stream not in entry.streams:
                    entry.streams.append(stream)
                return entry
        entry = Entry(
            ts=ts,
            worker=worker,
            kind=kind,
            text=text,
            important=kind in IMPORTANT_EVENTS,
            streams=[stream] if stream else [],
            key=key,
        )
        self._append(entry)
        return entry

    def _append(self, entry: Entry) -> None:
        self.entries.append(entry)
        if len(self.entries) > MAX_ENTRIES:
            del self.entries[: len(self.entries) - MAX_ENTRIES]

    def lines(self, limit: int) -> list[str]:
        """At most ``limit`` lines, oldest first: the newest important entries, then the newest
        routine ones in the room left."""
        if limit <= 0:
            return []
        important = [i for i, e in enumerate(self.entries) if e.important][-limit:]
        room = limit - len(important)
        routine = [i for i, e in enumerate(self.entries) if not e.important][-room:] if room else []
        # In time order (a worker's log is read a moment after a typed command's note).
        chosen = sorted(important + routine, key=lambda i: (self.entries[i].ts, i))
        return [self.entries[i].line() for i in chosen]


def _paren(text: str) -> str:
    return f" ({text})" if text else ""


# --- Rendering ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How many rows each section gets on a screen ``height`` lines high."""

    workers: int
    streams: int
    events: int

    @classmethod
    def fit(cls, height: int, workers: int, streams: int) -> Layout:
        """Rows per section: the fixed lines are the header (2), two section titles with
        their table headers (4), the events title (1), the help and the prompt (2)."""
        free = max(3, height - 9)
        shown_workers = min(workers, max(1, free // 3))
        free -= shown_workers
        least_events = min(4, max(1, free // 3))
        shown_streams = max(1, min(streams, free - least_events))
        events = max(1, min(10, free - shown_streams))
        return cls(workers=shown_workers, streams=shown_streams, events=events)


def _pick(rows: list[Any], limit: int, urgent: Iterable[bool]) -> list[Any]:
    """``limit`` rows, those that need attention first, shown in their original order."""
    flags = list(urgent)
    order = sorted(range(len(rows)), key=lambda i: (not flags[i], i))[:limit]
    return [rows[i] for i in sorted(order)]


def _table(columns: tuple[tuple[str, str], ...], rows: list[tuple[Any, ...]]) -> Table:
    """A borderless table whose columns keep their full width but the last (a note), which is
    cut with an ellipsis when the screen is narrow: rich would squeeze every column instead."""
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1), expand=False)
    for index, (name, justify) in enumerate(columns):
        cells = [str(row[index]) for row in rows]
        width = max([len(name), *(len(cell) for cell in cells)])
        last = index == len(columns) - 1
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            min_width=None if last else width,
        )
    for row in rows:
        table.add_row(*row)
    return table


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def render(
    snapshot: Snapshot | None,
    events: EventLog,
    *,
    header: str,
    typed: str,
    last_result: str,
    height: int,
    info: str | None = None,
) -> RenderableType:
    """The whole view for a screen ``height`` lines high (the width is the console's; every
    row is one line, cut with an ellipsis rather than wrapped)."""
    lines: list[RenderableType] = [Text(header, no_wrap=True, overflow="ellipsis")]
    regions = _regions_line(snapshot)
    if snapshot is not None and time.time() - snapshot.at > STALE_SECONDS:
        regions = f"(read {time.time() - snapshot.at:.0f} s ago) {regions}"
    lines.append(Text(regions, no_wrap=True, overflow="ellipsis", style="bold"))
    prompt = Text(no_wrap=True, overflow="ellipsis")
    prompt.append("> ", style="bold")
    prompt.append(typed)
    prompt.append("▏", style="blink")
    if last_result:
        prompt.append(f"   {last_result}", style="dim")
    footer = [Text(HELP, no_wrap=True, overflow="ellipsis", style="dim"), prompt]
    if info is not None:
        room = max(1, height - len(lines) - len(footer))
        body = info.splitlines()[:room]
        lines += [Text(line, no_wrap=True, overflow="ellipsis") for line in body]
        return Group(*lines, *footer)
    if snapshot is None:
        lines.append(Text("starting..."))
        return Group(*lines, *footer)
    layout = Layout.fit(height, len(snapshot.workers), len(snapshot.streams))
    workers = _pick(list(snapshot.workers), layout.workers, (w.dead for w in snapshot.workers))
    hidden_workers = len(snapshot.workers) - len(workers)
    title = f"workers ({len(snapshot.workers)}"
    title += f", {hidden_workers} not shown)" if hidden_workers else ")"
    lines.append(Text(title, style="bold underline", no_wrap=True))
    worker_rows = []
    for w in workers:
        style = "red" if w.dead else "yellow" if w.state in ("paused", "draining") else ""
        worker_rows.append(
            (
                w.worker_id,
                _number(w.pid),
                Text(w.state, style=style),
                _number(w.connections),
                w.lease,
                Text(w.note, style="red" if w.dead else "dim"),
            )
        )
    lines.append(
        _table(
            (
                ("worker", "left"),
                ("pid", "right"),
                ("state", "left"),
                ("conns", "right"),
                ("lease", "left"),
                ("", "left"),
            ),
            worker_rows,
        )
    )
    streams = _pick(
        list(snapshot.streams), layout.streams, (s.needs_attention for s in snapshot.streams)
    )
    hidden = len(snapshot.streams) - len(streams)
    title = f"streams ({len(snapshot.streams)}"
    title += f", {hidden} not shown: those needing attention first)" if hidden else ")"
    lines.append(Text(title, style="bold underline", no_wrap=True, overflow="ellipsis"))
    stream_rows = []
    for s in streams:
        owner = Text(s.owner or "-")
        if s.owner_state:
            owner.append(f" {s.owner_state}", style="bold red")
        stream_rows.append(
            (
                s.stream_id,
                s.desired,
                owner,
                _number(s.checkpoint),
                _number(s.stored),
                _number(s.lag),
                _number(s.upstream),
                Text(s.note, style="yellow" if s.note else ""),
            )
        )
    lines.append(
        _table(
            (
                ("stream", "left"),
                ("state", "left"),
                ("owner", "left"),
                ("checkpoint", "right"),
                ("stored", "right"),
                ("lag", "right"),
                ("upstream", "right"),
                ("", "left"),
            ),
            stream_rows,
        )
    )
    lines.append(Text("events", style="bold underline"))
    shown = events.lines(layout.events) or ["(none yet)"]
    lines += [Text(line, no_wrap=True, overflow="ellipsis") for line in shown]
    return Group(*lines, *footer)


def _regions_line(snapshot: Snapshot | None) -> str:
    if snapshot is None:
        return "regions: starting"
    if snapshot.regions is None:
        return f"regions: {snapshot.regions_error or 'not running'}"
    r = snapshot.regions

    def region(name: str, mode: str) -> str:
        return f"{name} {mode}" + (", alarm" if r.alarms.get(name) == "ALARM" else "")

    # The serving region first: a narrow screen cuts the end of the line.
    return (
        f"WebSocket API: serving {r.serving} · {region(r.primary, r.primary_mode)} · "
        f"{region(r.secondary, r.secondary_mode)}"
    )

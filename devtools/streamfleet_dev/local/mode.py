"""``make local``: the whole fleet on this machine, with a live view you can poke at.

Starts the local servers (dynalite for DynamoDB, moto's server mode for SQS; ``--dynamodb moto``
puts DynamoDB on moto too),
creates the tables and queue from :mod:`streamfleet.model`, serves the event REST API through
the real event-router handler, starts the fake upstream and N worker processes, STARTs a set of
streams through that API, and shows workers, streams and lease events live.

Type a command and Enter while it runs::

    k 2   kill -9 worker 2          t 2   SIGTERM worker 2
    p 2   pause worker 2 (SIGSTOP)  c 2   continue worker 2 (SIGCONT)
    a     add a worker              s ID  START stream ID     x ID  STOP stream ID
    q     quit (Ctrl-C works too)

The operator CLI works against it from a second terminal (the banner prints the environment).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from streamfleet import model
from streamfleet_dev.upstream.process import UpstreamProcess

from .fleet import Fleet, WorkerProcess
from .servers import LOCAL_AWS_ENV, LocalServer, dynalite_server, free_port, moto_server

# Slow enough to watch, fast enough that a kill -9 recovers while you look.
DEMO_TIMING = {
    "LEASE_SECONDS": "4",
    "HEARTBEAT_EVERY": "1",
    "MAX_CLOCK_SKEW_SECONDS": "0.25",
    "SAFETY_MARGIN_SECONDS": "0.25",
    "RECONCILE_EVERY": "2",
    "STOP_CHECK_EVERY": "1",
    "CHECKPOINT_EVERY": "0.5",
    "SQS_WAIT_SECONDS": "2",
    "METRICS_EVERY": "5",
}
LEASE_EVENTS = {
    "session_opened",
    "lease_gained",
    "lease_taken_over",
    "lease_lost",
    "lease_released",
    "lease_handed_over",
    "deadline_passed",
    "session_reopened",
    "draining",
    "worker_stopped",
}
HELP = "k N kill -9 · t N SIGTERM · p N pause · c N continue · a add · s ID start · x ID stop · q"


@dataclass
class LocalMode:
    """The running system and what the live view shows of it."""

    fleet: Fleet
    api_url: str
    events: deque[str] = field(default_factory=lambda: deque(maxlen=12))
    paused: set[str] = field(default_factory=set)
    _offsets: dict[str, int] = field(default_factory=dict)

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
            return f"{error.code} {json.load(error).get('error')}"

    def start(self, stream_id: str) -> str:
        url = self.fleet.upstream.url_for(stream_id)
        body = {"event_type": "START", "connection_id": stream_id, "ws_url": url}
        return self.post_event(body)

    def stop(self, stream_id: str) -> str:
        return self.post_event({"event_type": "STOP", "connection_id": stream_id})

    def worker(self, number: str) -> WorkerProcess | None:
        return self.fleet.workers.get(f"w{number}")

    def command(self, line: str) -> str:
        """Carry out one typed command; returns what happened, for the event list."""
        verb, _, argument = line.strip().partition(" ")
        argument = argument.strip()
        signals = {"k": signal.SIGKILL, "t": signal.SIGTERM, "p": signal.SIGSTOP}
        if verb == "a":
            return f"added {self.fleet.start_worker().worker_id}"
        if verb == "s" and argument:
            return f"START {argument}: {self.start(argument)}"
        if verb == "x" and argument:
            return f"STOP {argument}: {self.stop(argument)}"
        if verb in (*signals, "c"):
            worker = self.worker(argument)
            if worker is None or not worker.alive():
                return f"no running worker w{argument}"
            worker.signal(signals.get(verb, signal.SIGCONT))
            (self.paused.add if verb == "p" else self.paused.discard)(worker.worker_id)
            names = {"k": "kill -9", "t": "SIGTERM", "p": "SIGSTOP", "c": "SIGCONT"}
            return f"{names[verb]} {worker.worker_id}"
        return f"unknown command {line.strip()!r} ({HELP})"

    # -- the view -----------------------------------------------------------------------------

    def _tail(self, worker: WorkerProcess) -> None:
        offset = self._offsets.get(worker.worker_id, 0)
        with open(worker.log_path, "rb") as log:
            log.seek(offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offsets[worker.worker_id] = offset + len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if not line.startswith('{"ts"'):
                continue
            record = json.loads(line)
            if record.get("event") in LEASE_EVENTS:
                when = time.strftime("%H:%M:%S", time.localtime(record["ts"]))
                detail = record.get("pk", "").removeprefix(model.CONNECTION_PREFIX)
                extra = record.get("reason") or record.get("via") or ""
                self.events.append(
                    f"{when} {record['worker']:>4} {record['event']} {detail} {extra}"
                )

    def snapshot(self) -> dict[str, Any]:
        """Everything the view shows, read from the table, the upstream and the logs."""
        for worker in self.fleet.workers.values():
            self._tail(worker)
        return {"rows": self.fleet.rows(), "upstream": self.fleet.upstream.stats()}

    def render(self, snapshot: dict[str, Any]) -> Group:
        rows, upstream = snapshot["rows"], snapshot["upstream"]
        held: dict[str, int] = {}
        for row in rows.values():
            if row.get(model.LEASE_OWNER):
                held[row[model.LEASE_OWNER]] = held.get(row[model.LEASE_OWNER], 0) + 1
        workers = Table(title="workers", expand=True)
        for column in ("worker", "pid", "state", "connections"):
            workers.add_column(column)
        for worker_id, worker in self.fleet.workers.items():
            state = (
                "paused"
                if worker_id in self.paused
                else "running"
                if worker.alive()
                else f"exited {worker.process.returncode}"
            )
            workers.add_row(worker_id, str(worker.process.pid), state, str(held.get(worker_id, 0)))
        streams = Table(title="streams", expand=True)
        for column in ("stream", "state", "owner", "persisted seq", "upstream seq", "lag"):
            streams.add_column(column)
        for stream_id, row in sorted(rows.items()):
            head = upstream["head"].get(stream_id, 0)
            last = row.get(model.LAST_SEQ, 0)
            lag = head - last if row.get(model.DESIRED_STATE) == "STARTED" else ""
            streams.add_row(
                stream_id,
                row.get(model.DESIRED_STATE, ""),
                row.get(model.LEASE_OWNER) or "-",
                str(last),
                str(head),
                str(lag),
            )
        recent = Panel("\n".join(self.events) or "(none yet)", title="recent lease events")
        return Group(workers, streams, recent, Panel(HELP, title="type a command + Enter"))


async def run(args: argparse.Namespace, workdir: Path) -> None:
    os.environ.update(LOCAL_AWS_ENV)
    servers: list[LocalServer] = [moto_server(workdir / "moto.log").start()]
    if args.dynamodb == "dynalite":
        servers.append(dynalite_server(workdir / "dynalite.log").start())
    os.environ["AWS_ENDPOINT_URL_SQS"] = servers[0].endpoint
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = servers[-1].endpoint
    console = Console()
    upstream = UpstreamProcess(rate=args.rate, keepalive_seconds=1.0).start()
    fleet = Fleet(
        endpoint=servers[-1].endpoint, upstream=upstream, tmp=workdir, extra_env=DEMO_TIMING
    )
    api_port = free_port()
    router_env = {
        **os.environ,
        "TABLE_NAME": fleet.lease_table,
        "QUEUE_URL": fleet.queue_url,
        "ALLOWED_UPSTREAMS": f"ws://127.0.0.1:{upstream.port}",
    }
    router = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streamfleet_dev.local.http_adapter",
        "--port",
        str(api_port),
        env=router_env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    mode = LocalMode(fleet=fleet, api_url=f"http://127.0.0.1:{api_port}")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    commands: asyncio.Queue[str] = asyncio.Queue()
    try:
        for _ in range(args.workers):
            fleet.start_worker()
        await _wait_for_api(mode)
        for n in range(args.streams):
            mode.events.append(
                f"START s{n:02d}: {await asyncio.to_thread(mode.start, f's{n:02d}')}"
            )
        console.print(
            Panel(
                "\n".join(
                    f"export {k}={v}"
                    for k, v in {
                        "AWS_ENDPOINT_URL_DYNAMODB": os.environ["AWS_ENDPOINT_URL_DYNAMODB"],
                        "AWS_ENDPOINT_URL_SQS": os.environ["AWS_ENDPOINT_URL_SQS"],
                        "AWS_ACCESS_KEY_ID": "local",
                        "AWS_SECRET_ACCESS_KEY": "local",
                        "AWS_DEFAULT_REGION": "us-east-1",
                        "TABLE_NAME": fleet.lease_table,
                        "QUEUE_URL": fleet.queue_url,
                    }.items()
                )
                + f'\n# event API: {mode.api_url}/events   then: make cli ARGS="workers"',
                title="local fleet: use the operator CLI from another terminal with",
            )
        )
        _read_commands(loop, commands, stopping)
        deadline = time.monotonic() + args.duration if args.duration else None
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while not stopping.is_set() and (deadline is None or time.monotonic() < deadline):
                while not commands.empty():
                    line = commands.get_nowait()
                    if line.strip() == "q":
                        stopping.set()
                        break
                    mode.events.append(await asyncio.to_thread(mode.command, line))
                live.update(mode.render(await asyncio.to_thread(mode.snapshot)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 0.5)
        if args.summary:
            _print_summary(mode)
    finally:
        console.print("shutting down: workers hand over, then everything stops")
        for worker in fleet.workers.values():
            if worker.alive():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGTERM)
        for worker in fleet.workers.values():
            with contextlib.suppress(Exception):
                worker.process.wait(15)
        fleet.close()
        router.terminate()
        await router.wait()
        upstream.stop()
        for server in servers:
            server.stop()


def _api_answers(api_url: str) -> bool:
    try:
        urllib.request.urlopen(f"{api_url}/connections/probe", timeout=1).close()
    except urllib.error.HTTPError:
        return True  # a 404 for the probe is an answer
    except OSError:
        return False
    return True


async def _wait_for_api(mode: LocalMode) -> None:
    for _ in range(100):
        if await asyncio.to_thread(_api_answers, mode.api_url):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the local event API at {mode.api_url} did not start")


def _read_commands(
    loop: asyncio.AbstractEventLoop, commands: asyncio.Queue[str], stopping: asyncio.Event
) -> None:
    """Typed lines reach the loop from a daemon thread (stdin has no asyncio reader here)."""

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line)
        loop.call_soon_threadsafe(commands.put_nowait, "")  # stdin closed: keep running

    threading.Thread(target=read, daemon=True, name="stdin").start()


def _print_summary(mode: LocalMode) -> None:
    snapshot = mode.snapshot()
    rows, connected = snapshot["rows"], snapshot["upstream"]["connected"]
    print(
        json.dumps(
            {
                "streams": {
                    sid: {
                        "state": row.get(model.DESIRED_STATE),
                        "owner": row.get(model.LEASE_OWNER),
                        "connected": connected.get(sid, 0),
                        "last_seq": row.get(model.LAST_SEQ, 0),
                    }
                    for sid, row in sorted(rows.items())
                },
                "workers": {wid: w.alive() for wid, w in mode.fleet.workers.items()},
                "events": list(mode.events),
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
    parser.add_argument("--summary", action="store_true", help="print a JSON summary at the end")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.streams < 0 or args.rate <= 0:
        parser.error("--workers must be ≥ 1, --streams ≥ 0, --rate > 0")
    with tempfile.TemporaryDirectory(prefix="streamfleet-local-") as tmp:
        asyncio.run(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

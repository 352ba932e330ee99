"""Live delivery figures, on :class:`~streamfleet_dev.wsapi.e2e.LiveWorld`: the whole
system on loopback (the fake upstream, real worker processes, the messages table on moto's
server with its real DynamoDB Stream, each Region's fan-out Lambda from its synthesized asset
behind the local event source mapping, both Regions' API, canaries and failover resolver).

1. **Latency**: upstream frame -> delivery to the application, p50 and p99, for Python
   :class:`~streamfleet_client.ReconnectingClient` subscribers (3 per stream, run in a process
   of their own, as clients are on other machines) and for demo pages in Debian's Chromium.
   The fake upstream's message ``seq`` of a stream is produced at ``created_at + seq / rate``
   on the machine's monotonic clock (``CLOCK_MONOTONIC`` is one clock for every process);
   ``created_at`` of every stream is pinned from ``GET /stats`` samples (each bounds it by the
   head it reports), so every delivery's latency is measured from the upstream's send time.
   Each delivery also carries ``at``, the worker's receipt time (what the protocol has), which
   splits the figure into upstream -> worker and worker -> client.
2. **Cost**: the fan-out's Management API posts and invocations per 1,000 delivered messages,
   from its own EMF documents (both Regions), with the template's batching (no batching
   window) and with a 0.5 s batching window (``StreamFanoutProps.max_batching_window``).
3. **Replay**: a client subscribing ``after`` 10,000 messages behind (seeded straight into the
   primary's messages table under the model's attribute names): messages per second until it
   has every seq, exactly once and in order.
4. **Pauses**: the longest delivery pause a subscribed client saw during a worker's ``kill -9``,
   a network drop and a regional failover (:func:`~streamfleet_dev.wsapi.live_drill.run_live_drill`,
   the full drill; median over runs).

Usage: ``python -m bench.fanout_bench [--quick] [--scales 20,100] [--drill-runs 3]``; prints
each figure as it lands and writes the manual's page ``docs/benchmarks/fanout.md``, with the
machine, the date and the load (``--quick``: a smoke run at a small scale, written next to its
logs in a temporary directory, never over the manual's page).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfleet_dev import pages

RESULTS = pages.PAGES / "fanout.md"
OUTPUTS = (RESULTS,)
REPO = pages.REPO
RATE = 5.0  # messages per second per stream (the figure)
SUBSCRIBERS_PER_STREAM = 3
WORKERS = 3
REPLAY_BEHIND = 10_000
BATCHING_WINDOW_SECONDS = 0.5
# A scale is "sustained" when its clients got (nearly) everything produced in the window and
# the latency at the end of the window is no worse than at its start: no growing backlog.
SUSTAINED_DELIVERED_FRACTION = 0.97
SUSTAINED_DRIFT_SECONDS = 0.5


def log(text: str) -> None:
    print(text, flush=True)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


# --- The subscribers' process --------------------------------------------------------------------


async def _client_pool(spec: dict[str, Any]) -> None:
    """Run in a child process: ``spec["clients"]`` subscribed clients; commands on stdin."""
    from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage

    url = spec["url"]
    records: dict[str, list[tuple[int, float, int | None, str]]] = {}
    first_after: dict[str, Any] = {}
    clients: list[tuple[dict[str, Any], ReconnectingClient]] = []
    for entry in spec["clients"]:
        name = entry["user"]
        records[name] = []

        def provider(attempt: int, *, force_refresh: bool = False, token=entry["token"]) -> Any:
            return Endpoint(url, token)

        def delivered(message: StreamMessage, sink=records[name]) -> None:
            sink.append((message.seq, time.time(), message.received_at_ms, message.source))

        def replied(message: dict[str, Any], name=name) -> None:
            if message.get("type") == "subscribed" and name not in first_after:
                first_after[name] = message.get("after")

        client = ReconnectingClient(
            provider,
            ClientConfig(
                heartbeat_interval=10.0,
                heartbeat_timeout=20.0,
                backoff_base=0.2,
                backoff_cap=2.0,
                open_timeout=20.0,
                request_timeout=30.0,
                gap_timeout=2.0,
            ),
            on_stream_message=delivered,
            on_message=replied,
            name=name,
        )
        clients.append((entry, client))
    async with contextlib.AsyncExitStack() as stack:
        for _, client in clients:
            await stack.enter_async_context(client)
        gate = asyncio.Semaphore(8)  # the subscribes' handler runs share the same 2 cores

        async def subscribe(entry: dict[str, Any], client: ReconnectingClient) -> None:
            async with gate:
                await client.wait_ready(120)
                await client.subscribe(entry["stream"], after=entry.get("after"))

        started = time.monotonic()
        await asyncio.gather(*(subscribe(entry, client) for entry, client in clients))
        print(
            json.dumps(
                {"event": "ready", "clients": len(clients), "s": time.monotonic() - started}
            ),
            flush=True,
        )
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command["cmd"] == "dump":
                out = {
                    "clients": [
                        {
                            "user": entry["user"],
                            "stream": entry["stream"],
                            "first_after": first_after.get(entry["user"]),
                            "connections": client.connections,
                            "duplicates": sum(
                                c.stats.duplicates for c in client.subscriptions.values()
                            ),
                            "deliveries": records[entry["user"]],
                        }
                        for entry, client in clients
                    ]
                }
                await asyncio.to_thread(Path(command["path"]).write_text, json.dumps(out))
                print(json.dumps({"event": "dumped"}), flush=True)
            elif command["cmd"] == "quit":
                break
    print(json.dumps({"event": "bye"}), flush=True)


class ClientPool:
    """The subscribers' process (``python -m bench.fanout_bench --client-pool``)."""

    def __init__(self, url: str, clients: list[dict[str, Any]], log_path: Path):
        self.url = url
        self.clients = clients
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float) -> float:
        """Until every client is connected and subscribed; how long that took."""
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                str(REPO / part) for part in ("runtime", "devtools", ".")
            ),
        }
        self._stderr = await asyncio.to_thread(open, self.log_path, "ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.fanout_bench",
            "--client-pool",
            cwd=REPO,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
        )
        await self._send({"url": self.url, "clients": self.clients})
        answer = await self._answer(timeout)
        if answer.get("event") != "ready":
            raise RuntimeError(f"client pool: {answer}")
        return float(answer["s"])

    async def dump(self) -> list[dict[str, Any]]:
        path = Path(tempfile.mkstemp(prefix="fanout-bench-", suffix=".json")[1])
        await self._send({"cmd": "dump", "path": str(path)})
        await self._answer(120)
        try:
            return json.loads(await asyncio.to_thread(path.read_text))["clients"]
        finally:
            await asyncio.to_thread(path.unlink)

    async def stop(self) -> None:
        process = self.process
        if process is None:
            return
        self.process = None
        with contextlib.suppress(Exception):
            await self._send({"cmd": "quit"}, process)
            await asyncio.wait_for(process.wait(), 30)
        if process.returncode is None:
            process.kill()
            await process.wait()
        self._stderr.close()

    async def _send(self, message: dict[str, Any], process: Any = None) -> None:
        process = process or self.process
        assert process is not None and process.stdin is not None
        process.stdin.write((json.dumps(message) + "\n").encode())
        await process.stdin.drain()

    async def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
            if not line:
                raise RuntimeError(
                    f"client pool exited ({await self.process.wait()}); see {self.log_path}"
                )
            text = line.decode(errors="replace").strip()
            if text.startswith("{"):
                return json.loads(text)


# --- The upstream's clock ------------------------------------------------------------------------


def pin_created_at(
    upstream: Any, streams: list[str], seconds: float
) -> dict[str, tuple[float, float]]:
    """Each stream's ``created_at`` on the monotonic clock, as ``(estimate, half-width)``.

    A ``/stats`` answer read between ``t0`` and ``t1`` with head ``h`` means the upstream's
    clock read ``now`` in ``[t0, t1]`` with ``h <= (now - created_at) * rate < h + 1``: so
    ``t0 - (h + 1) / rate < created_at <= t1 - h / rate``. Samples over more than a message
    interval pin it to about one request's duration.
    """
    low = {s: -math.inf for s in streams}
    high = {s: math.inf for s in streams}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        stats = upstream.stats()
        t1 = time.monotonic()
        rate = float(stats["rate"])
        for stream in streams:
            head = stats["head"].get(stream)
            if head is None or head < 1:
                continue
            low[stream] = max(low[stream], t0 - (head + 1) / rate)
            high[stream] = min(high[stream], t1 - head / rate)
        time.sleep(0.003)
    pinned = {}
    for stream in streams:
        if not (math.isfinite(low[stream]) and math.isfinite(high[stream])):
            raise RuntimeError(f"{stream}: the upstream reported no head")
        pinned[stream] = ((low[stream] + high[stream]) / 2, (high[stream] - low[stream]) / 2)
    return pinned


def wall_minus_monotonic() -> float:
    samples = []
    for _ in range(5):
        a = time.monotonic()
        wall = time.time()
        b = time.monotonic()
        samples.append(wall - (a + b) / 2)
    return statistics.median(samples)


# --- Figures -------------------------------------------------------------------------------------


@dataclass
class LoadSampler:
    """``os.getloadavg()`` once a second while a phase runs."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg())
            await asyncio.sleep(1.0)

    def start(self) -> LoadSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
        one = [s[0] for s in self.samples] or [math.nan]
        return {"load1_mean": round(statistics.fmean(one), 2), "load1_max": round(max(one), 2)}


@dataclass
class Window:
    started: float  # epoch seconds
    ended: float


def check_exactly_once(clients: list[dict[str, Any]]) -> dict[str, Any]:
    """Every client's deliveries: consecutive seqs from its first, none twice."""
    problems = []
    for client in clients:
        seqs = [d[0] for d in client["deliveries"]]
        if not seqs:
            problems.append(f"{client['user']}: nothing delivered")
            continue
        start = client["first_after"] + 1 if isinstance(client["first_after"], int) else seqs[0]
        if seqs != list(range(start, start + len(seqs))):
            dups = len(seqs) - len(set(seqs))
            missing = sorted(set(range(start, seqs[-1] + 1)) - set(seqs))
            problems.append(
                f"{client['user']} ({client['stream']}): {len(seqs)} delivered from {start}; "
                f"duplicates {dups}, missing {missing[:10]}"
            )
    return {"clients": len(clients), "problems": problems}


def metric_names() -> dict[str, str]:
    from streamfleet import model

    return {
        "delivered": model.METRIC_FANOUT_DELIVERED,
        "posts": model.METRIC_FANOUT_POSTS,
        "failed": model.METRIC_FANOUT_FAILED_POSTS,
        "gone": model.METRIC_FANOUT_GONE,
    }


@dataclass(frozen=True)
class ScaleConfig:
    streams: int
    warmup: float
    seconds: float
    browser_pages: int
    batching_seconds: float  # a second window with a batching window set; 0: skip it
    replay_runs: int  # 0: no replay figure at this scale


async def measure_scale(config: ScaleConfig, log_root: Path) -> dict[str, Any]:
    """One world at one scale: latency, cost, and (optionally) batching and replay."""
    from streamfleet_dev.wsapi.browser import BrowserPages, PageSpec, missing_prerequisites
    from streamfleet_dev.wsapi.e2e import LiveWorld, WorldSettings
    from streamfleet_dev.wsapi.live_drill import DIST

    use_browser = config.browser_pages > 0 and not missing_prerequisites()
    log_dir = log_root / f"scale-{config.streams}"
    settings = WorldSettings(
        streams=config.streams,
        rate=RATE,
        workers=WORKERS,
        static_dir=DIST if use_browser else None,
        log_dir=log_dir,
        stream_prefix="bench",
    )
    result: dict[str, Any] = {
        "streams": config.streams,
        "rate": RATE,
        "subscribers_per_stream": SUBSCRIBERS_PER_STREAM,
        "python_clients": config.streams * SUBSCRIBERS_PER_STREAM,
        "browser_pages": config.browser_pages if use_browser else 0,
        "workers": WORKERS,
    }
    started = time.monotonic()
    async with LiveWorld(settings) as world:
        assert world.regions is not None and world.upstream is not None
        regions = world.regions
        await world.wait_live(180)
        result["world_start_s"] = round(time.monotonic() - started, 1)
        primary = regions.settings.primary
        streams = world.stream_ids
        url = regions.resolve()["url"]
        specs = [
            {
                "user": f"sub-{index:04d}",
                "token": regions.mint_token(f"sub-{index:04d}", expires_in=3600),
                "stream": streams[index % len(streams)],
            }
            for index in range(len(streams) * SUBSCRIBERS_PER_STREAM)
        ]
        pool = ClientPool(url, specs, log_dir / "client-pool.log")
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(pool.stop)
            result["subscribe_all_s"] = round(await pool.start(600), 1)
            log(f"  {len(specs)} Python clients subscribed in {result['subscribe_all_s']} s")
            browser = None
            if use_browser:
                pages = [
                    PageSpec(f"page-{index:02d}", streams[index % len(streams)])
                    for index in range(config.browser_pages)
                ]
                browser = await stack.enter_async_context(
                    BrowserPages(regions.http_url, pages, log_dir / "browser")
                )
                result["browser"] = browser.browser_version
            durations = _time_invocations(regions.regions[primary].event_source)
            pinned = await asyncio.to_thread(pin_created_at, world.upstream, streams, 1.5)
            offset = wall_minus_monotonic()
            result["created_at_uncertainty_ms"] = round(
                max(half for _, half in pinned.values()) * 1000, 1
            )

            def due(stream: str):
                created = pinned[stream][0]
                return lambda seq: created + seq / RATE + offset

            await asyncio.sleep(config.warmup)
            durations.clear()
            window, load = await _window(world, config.seconds)
            result["primary_invocation_ms"] = {
                "p50": round(quantile(durations, 0.5) * 1000, 1),
                "p99": round(quantile(durations, 0.99) * 1000, 1),
            }
            result["load"] = load
            result["window_s"] = config.seconds
            clients = await pool.dump()
            pages_read = await browser.read() if browser is not None else []
            # Latency -------------------------------------------------------------------------
            per_stream: dict[str, list[tuple[int, float, int | None]]] = {}
            for client in clients:
                per_stream.setdefault(client["stream"], []).extend(
                    (d[0], d[1], d[2]) for d in client["deliveries"]
                )
            everything = _latencies(per_stream, due, window)
            result["python"] = everything
            expected = config.streams * SUBSCRIBERS_PER_STREAM * RATE * config.seconds
            result["python"]["delivered_fraction"] = round(
                everything["samples"] / expected if expected else math.nan, 3
            )
            if pages_read:
                browser_stream: dict[str, list[tuple[int, float, int | None]]] = {}
                for page in pages_read:
                    browser_stream.setdefault(page["stream"], []).extend(
                        (seq, at / 1000, None)
                        for seq, at in zip(page["seqs"], page["deliveredAtMs"], strict=False)
                    )
                result["browser_latency"] = _latencies(browser_stream, due, window)
            result["exactly_once"] = check_exactly_once(clients)
            result["reconnects"] = sum(max(0, c["connections"] - 1) for c in clients)
            result["sustained"] = _sustained(result["python"])
            # Cost ----------------------------------------------------------------------------
            result["cost"] = _cost(regions, window)
            result["iterator_age_ms"] = _iterator_age(regions, primary)
            log(f"  latency {json.dumps(result['python'])}")
            if "browser_latency" in result:
                log(f"  browser {json.dumps(result['browser_latency'])}")
            log(
                f"  cost {json.dumps(result['cost'])}; load {load}; sustained {result['sustained']}"
            )
            # Batching window -----------------------------------------------------------------
            if config.batching_seconds > 0:
                for region in regions.regions.values():
                    assert region.event_source is not None
                    region.event_source.settings = dataclasses.replace(
                        region.event_source.settings, max_batching_window=BATCHING_WINDOW_SECONDS
                    )
                await asyncio.sleep(3.0)
                window, load = await _window(world, config.batching_seconds)
                clients = await pool.dump()
                per_stream = {}
                for client in clients:
                    per_stream.setdefault(client["stream"], []).extend(
                        (d[0], d[1], d[2]) for d in client["deliveries"]
                    )
                result["batching"] = {
                    "window_s": BATCHING_WINDOW_SECONDS,
                    "measured_s": config.batching_seconds,
                    "python": _latencies(per_stream, due, window),
                    "cost": _cost(regions, window),
                    "load": load,
                    "exactly_once": check_exactly_once(clients),
                }
                log(
                    f"  with a {BATCHING_WINDOW_SECONDS} s batching window: "
                    f"{json.dumps(result['batching'])[:600]}"
                )
                for region in regions.regions.values():
                    assert region.event_source is not None
                    region.event_source.settings = dataclasses.replace(
                        region.event_source.settings, max_batching_window=0.0
                    )
            await pool.stop()
        # Replay ------------------------------------------------------------------------------
        if config.replay_runs:
            await world.stop_streams(world.stream_ids)
            result["replay"] = await measure_replay(world, config.replay_runs)
    result["total_s"] = round(time.monotonic() - started, 1)
    return result


def _latencies(
    per_stream: dict[str, list[tuple[int, float, int | None]]], due: Any, window: Window
) -> dict[str, Any]:
    """All streams' deliveries together, each against its own stream's clock."""
    total, to_worker, from_worker, times = [], [], [], []
    for stream, deliveries in per_stream.items():
        stream_due = due(stream)
        for seq, at, received in deliveries:
            if not window.started <= at <= window.ended:
                continue
            sent = stream_due(seq)
            total.append(at - sent)
            times.append(at)
            if received is not None:
                to_worker.append(received / 1000 - sent)
                from_worker.append(at - received / 1000)
    fifth = max(1, len(total) // 5)
    by_time = [lat for _, lat in sorted(zip(times, total, strict=True))]

    def ms(values: list[float], q: float) -> float:
        return round(quantile(values, q) * 1000, 1)

    return {
        "samples": len(total),
        "p50_ms": ms(total, 0.5),
        "p99_ms": ms(total, 0.99),
        "max_ms": ms(total, 1.0),
        "upstream_to_worker_p50_ms": ms(to_worker, 0.5),
        "upstream_to_worker_p99_ms": ms(to_worker, 0.99),
        "worker_to_client_p50_ms": ms(from_worker, 0.5),
        "worker_to_client_p99_ms": ms(from_worker, 0.99),
        "first_fifth_p50_ms": ms(by_time[:fifth], 0.5),
        "last_fifth_p50_ms": ms(by_time[-fifth:], 0.5),
    }


def _sustained(figures: dict[str, Any]) -> bool:
    drift = (figures["last_fifth_p50_ms"] - figures["first_fifth_p50_ms"]) / 1000
    # Far more than was produced in the window is a backlog being drained, not a steady state.
    fraction = figures.get("delivered_fraction", 0)
    return (
        SUSTAINED_DELIVERED_FRACTION <= fraction <= 2 - SUSTAINED_DELIVERED_FRACTION
        and abs(drift) <= SUSTAINED_DRIFT_SECONDS
    )


def _cost(regions: Any, window: Window) -> dict[str, Any]:
    names = metric_names()
    by_region = {}
    for name in regions.regions:
        documents = regions.fanout_metrics(name)
        inside = [
            d
            for d in documents
            if window.started * 1000 <= d["_aws"]["Timestamp"] <= window.ended * 1000
        ]
        by_region[name] = {
            "invocations": len(inside),
            "records": sum(d.get("records", 0) for d in inside),
            "messages": sum(d.get("messages", 0) for d in inside),
            "delivered": sum(d.get(names["delivered"], 0) for d in inside),
            "posts": sum(d.get(names["posts"], 0) for d in inside),
            "failed_posts": sum(d.get(names["failed"], 0) for d in inside),
            "gone": sum(d.get(names["gone"], 0) for d in inside),
        }
    delivered = sum(r["delivered"] for r in by_region.values())
    posts = sum(r["posts"] for r in by_region.values())
    invocations = sum(r["invocations"] for r in by_region.values())
    primary = by_region[regions.settings.primary]
    return {
        "by_region": by_region,
        "delivered": delivered,
        "posts_per_1000_delivered": round(posts * 1000 / delivered, 1) if delivered else math.nan,
        "invocations_per_1000_delivered": (
            round(invocations * 1000 / delivered, 1) if delivered else math.nan
        ),
        "primary_invocations_per_1000_delivered": (
            round(primary["invocations"] * 1000 / delivered, 1) if delivered else math.nan
        ),
        "records_per_invocation_primary": (
            round(primary["records"] / primary["invocations"], 1)
            if primary["invocations"]
            else math.nan
        ),
    }


def _time_invocations(source: Any) -> list[float]:
    """Wrap the event source's function to record how long each invocation takes (the
    local Lambda's round trip: the fan-out's subscriber reads and posts)."""
    durations: list[float] = []
    function = source.function

    def timed(event: dict[str, Any], context: Any) -> Any:
        started = time.monotonic()
        try:
            return function(event, context)
        finally:
            durations.append(time.monotonic() - started)

    source.function = timed
    return durations


def _iterator_age(regions: Any, region: str) -> dict[str, float]:
    source = regions.regions[region].event_source
    ages = source.stats.iterator_ages_ms[-2000:] if source is not None else []
    return {"p50": round(quantile(ages, 0.5), 1), "max": round(max(ages, default=math.nan), 1)}


async def _window(world: Any, seconds: float) -> tuple[Window, dict[str, float]]:
    sampler = LoadSampler().start()
    started = time.time()
    await asyncio.sleep(seconds)
    ended = time.time()
    return Window(started, ended), sampler.stop()


# --- Replay --------------------------------------------------------------------------------------


async def measure_replay(world: Any, runs: int) -> dict[str, Any]:
    """A client subscribing ``after`` :data:`REPLAY_BEHIND` messages behind, ``runs`` times."""
    from streamfleet import model
    from streamfleet.lease.dynamo import to_attr
    from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage

    assert world.regions is not None and world.proxy is not None
    regions = world.regions
    stream = "bench-replay"
    # The stream's row: STOPPED (no worker takes it), its readers, its origin; then its log.
    leases = world._boto("dynamodb", world.proxy.endpoint)
    await asyncio.to_thread(
        leases.put_item,
        TableName=world.lease_table,
        Item={
            model.PK: to_attr(model.connection_pk(stream)),
            model.DESIRED_STATE: to_attr("STOPPED"),
            model.READERS: to_attr(set(world.settings.readers)),
            model.ORIGIN_SEQ: to_attr(0),
        },
    )
    seeded_at = time.monotonic()
    await asyncio.to_thread(_seed_messages, world, stream, REPLAY_BEHIND)
    seeding_s = time.monotonic() - seeded_at
    log(f"  seeded {REPLAY_BEHIND} messages in {seeding_s:.1f} s")
    # The seeding went through both Regions' change streams: let the fan-outs and the
    # replication drain it before timing the replay.
    await _until_quiet(regions)
    timings = []
    problems = []
    url = regions.resolve()["url"]
    for run in range(runs):
        user = f"replay-{run}"
        token = regions.mint_token(user, expires_in=600)
        seqs: list[int] = []
        done = asyncio.Event()

        def delivered(message: StreamMessage, seqs=seqs, done=done) -> None:
            seqs.append(message.seq)
            if message.seq >= REPLAY_BEHIND:
                done.set()

        client = ReconnectingClient(
            lambda attempt, token=token, **_: Endpoint(url, token),
            ClientConfig(
                heartbeat_interval=10.0,
                heartbeat_timeout=20.0,
                request_timeout=60.0,
                backoff_base=0.2,
                backoff_cap=2.0,
            ),
            on_stream_message=delivered,
            name=user,
        )
        async with client:
            await client.wait_ready(30)
            started = time.monotonic()
            await client.subscribe(stream, after=0)
            await asyncio.wait_for(done.wait(), 300)
            elapsed = time.monotonic() - started
        if seqs != list(range(1, REPLAY_BEHIND + 1)):
            problems.append(
                f"run {run}: {len(seqs)} delivered, {len(seqs) - len(set(seqs))} duplicates"
            )
        timings.append(elapsed)
        log(
            f"  replay run {run + 1}: {REPLAY_BEHIND} in {elapsed:.2f} s "
            f"({REPLAY_BEHIND / elapsed:,.0f} msg/s)"
        )
    median = statistics.median(timings)
    return {
        "behind": REPLAY_BEHIND,
        "runs_s": [round(t, 2) for t in timings],
        "median_s": round(median, 2),
        "median_msgs_per_s": round(REPLAY_BEHIND / median),
        "replay_max_per_subscribe": _replay_max(),
        "problems": problems,
        "load": list(os.getloadavg()),
    }


def _replay_max() -> int:
    from streamfleet.wsapi.handlers.config import DEFAULT_REPLAY_MAX_MESSAGES

    return DEFAULT_REPLAY_MAX_MESSAGES


def _seed_messages(world: Any, stream: str, count: int) -> None:
    """``count`` messages of ``stream`` in the primary's messages table, as a worker writes them."""
    from streamfleet import model
    from streamfleet.lease.dynamo import to_attr

    client = world._boto("dynamodb", world.moto)
    now_ms = int(time.time() * 1000)
    pk = model.connection_pk(stream)
    items = [
        {
            model.PK: to_attr(pk),
            model.SEQ: to_attr(seq),
            model.MESSAGE_DATA: to_attr(f"{stream}:{seq}"),
            model.MESSAGE_RECEIVED_AT_MS: to_attr(now_ms - (count - seq) * 200),
            model.MESSAGE_WORKER: to_attr("bench-seed"),
            model.MESSAGE_EXPIRES_AT: to_attr(now_ms // 1000 + 86_400),
        }
        for seq in range(1, count + 1)
    ]
    for start in range(0, len(items), 25):
        request = {
            world.messages_tables[0]: [
                {"PutRequest": {"Item": i}} for i in items[start : start + 25]
            ]
        }
        while request:
            response = client.batch_write_item(RequestItems=request)
            request = response.get("UnprocessedItems") or {}


async def _until_quiet(regions: Any, quiet_for: float = 2.0, timeout: float = 300.0) -> None:
    """Until no Region's event source has processed a record for ``quiet_for`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        counts = tuple(
            r.event_source.stats.records for r in regions.regions.values() if r.event_source
        )
        if counts != last:
            last, since = counts, time.monotonic()
        elif time.monotonic() - since >= quiet_for:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the fan-outs did not go quiet")


# --- Pauses ------------------------------------------------------------------------------------


async def measure_pauses(runs: int, quick: bool, log_root: Path) -> dict[str, Any]:
    from streamfleet_dev.wsapi.live_drill import LiveDrillConfig, run_live_drill

    rows: list[list[dict[str, Any]]] = []
    oks = []
    for run in range(runs):
        base = LiveDrillConfig() if quick else LiveDrillConfig.full()
        config = dataclasses.replace(base, log_dir=log_root / f"drill-{run}")
        started = time.monotonic()
        report = await run_live_drill(config)
        oks.append(report.ok)
        rows.append(report.pauses())
        log(
            f"  drill run {run + 1} ({time.monotonic() - started:.0f} s, ok={report.ok}): "
            + "; ".join(
                f"{r['fault']}: python {r.get('python', {}).get('longest_pause_s')} s, "
                f"browser {r.get('browser', {}).get('longest_pause_s')} s"
                for r in rows[-1]
            )
        )
        if not report.ok:
            log(f"  drill problems: {report.problems[:5]}")
    faults = [row["fault"] for row in rows[0]] if rows else []
    summary = {}
    for index, fault in enumerate(faults):
        entry: dict[str, Any] = {}
        for kind in ("python", "browser"):
            values = [run[index][kind]["longest_pause_s"] for run in rows if kind in run[index]]
            if values:
                entry[kind] = {"median_s": round(statistics.median(values), 2), "runs": values}
        entry["healed_after_s"] = [round(run[index]["healed_after_s"], 2) for run in rows]
        summary[fault] = entry
    base = LiveDrillConfig() if quick else LiveDrillConfig.full()
    return {
        "runs": runs,
        "ok": oks,
        "faults": summary,
        "config": {
            "streams": base.streams,
            "python_clients": base.python_clients,
            "browser_pages": base.browser_pages,
            "heartbeat_s": list(base.heartbeat),
            "gap_timeout_s": base.gap_timeout,
        },
        "load": list(os.getloadavg()),
    }


# --- Report ------------------------------------------------------------------------------------


def timings() -> dict[str, Any]:
    from streamfleet_dev.local.fleet import FAST_ENV
    from streamfleet_dev.wsapi.e2e import WorldSettings

    world = WorldSettings()
    return {
        "worker": {
            k: FAST_ENV[k]
            for k in (
                "LEASE_SECONDS",
                "HEARTBEAT_EVERY",
                "RECONCILE_EVERY",
                "CHECKPOINT_EVERY",
                "SQS_WAIT_SECONDS",
            )
        },
        "canary_period_s": world.canary_period,
        "canary_timeout_s": world.canary_timeout,
        "healthy_runs_to_recover": world.healthy_runs_to_recover,
        "event_source_poll_s": world.event_source_poll,
    }


def machine() -> dict[str, Any]:
    chromium = ""
    with contextlib.suppress(Exception):
        chromium = subprocess.run(
            ["/usr/bin/chromium", "--version"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "chromium": chromium,
        "machine": pages.machine(),
        "commit": pages.commit(),
        "load_at_start": pages.load(),
    }


def markdown(figures: dict[str, Any]) -> str:
    m = figures["machine"]
    t = figures["timings"]
    host = m.get("machine") or f"{m['cores']} CPUs, Python {m['python']}"  # older runs: no memory
    lines = [
        "# Benchmark: live delivery",
        "",
        "*A smoke run (`--quick`): not the benchmark's figures.*"
        if figures["quick"]
        else pages.banner("fanout_bench", "live-delivery"),
        "",
        f"`python -m bench.fanout_bench{' --quick' if figures['quick'] else ''}`, run of "
        f"{figures['date']} at commit {m.get('commit', 'not recorded')}, "
        f"{figures['duration_s']:.0f} s. Machine: "
        f"{host}, "
        f"{m['platform']}, {m['chromium'] or 'no Chromium'}; load average at the start "
        f"{m['load_at_start']}, at the end {m.get('load_at_end', 'not recorded')}.",
        "",
        "Everything on loopback, on the same cores: moto's server (messages tables and their "
        "DynamoDB Streams, SQS), dynalite (leases, WebSocket API tables), the recording proxy, "
        "the fake upstream, "
        f"{WORKERS} worker processes, each Region's fan-out Lambda from its synthesized asset "
        "behind the local event source mapping (batch 100, the template's), the messages "
        "replication to the secondary, both Regions' gateways and handlers, the subscribers' "
        "process and Chromium. LiveWorld's compressed timings: worker "
        + ", ".join(f"{k}={v}" for k, v in t["worker"].items())
        + f"; canary every {t['canary_period_s']} s (timeout {t['canary_timeout_s']} s, "
        f"{t['healthy_runs_to_recover']} healthy runs to recover); the event source polls an "
        f"idle shard every {t['event_source_poll_s']} s (Lambda: about every 0.25 s).",
        "",
        "## 1. Upstream frame -> delivery latency",
        "",
        f"Each stream produces {RATE:g} msg/s; {SUBSCRIBERS_PER_STREAM} Python subscribers per "
        "stream (ReconnectingClient, in a process of their own, through the failover name); "
        "latency from the fake upstream's send time of the seq to the client's delivery to the "
        "application (after the cursor's reordering and de-duplication). *Worker -> client* is "
        "from the worker's receipt (`at`, carried by the protocol).",
        "",
        "| Streams | Subscribers | Window | Delivered | p50 | p99 | max | upstream->worker p50 | "
        "worker->client p50 / p99 | Browser p50 / p99 (pages) | Sustained | Load avg (mean/max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    measured = [scale for scale in figures["scales"] if "error" not in scale]
    for scale in figures["scales"]:
        if "error" in scale:
            lines.append(
                f"| {scale['streams']} | {scale['streams'] * SUBSCRIBERS_PER_STREAM} | - | - | - | "
                f"- | - | - | - | - | NO: {scale['error']} | - |"
            )
            continue
        p = scale["python"]
        b = scale.get("browser_latency")
        browser = (
            f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f} ms "
            f"({scale['browser_pages']}, {b['samples']} msgs)"
            if b
            else "-"
        )
        lines.append(
            f"| {scale['streams']} | {scale['python_clients']} | {scale['window_s']:.0f} s | "
            f"{p['samples']:,} ({p['delivered_fraction']:.0%}) | {p['p50_ms']:.0f} ms | "
            f"{p['p99_ms']:.0f} ms | {p['max_ms']:.0f} ms | "
            f"{p['upstream_to_worker_p50_ms']:.0f} ms | {p['worker_to_client_p50_ms']:.0f} / "
            f"{p['worker_to_client_p99_ms']:.0f} ms | {browser} | "
            f"{'yes' if scale['sustained'] else 'NO'} | {scale['load']['load1_mean']} / "
            f"{scale['load']['load1_max']} |"
        )
    lines += [""]
    for scale in measured:
        once = scale["exactly_once"]
        verdict = (
            "every client: consecutive seqs, none twice"
            if not once["problems"]
            else ("PROBLEMS: " + "; ".join(once["problems"][:5]))
        )
        lines.append(
            f"- {scale['streams']} streams: {verdict}; {scale['reconnects']} reconnects; "
            f"latency p50 in the window's first fifth "
            f"{scale['python']['first_fifth_p50_ms']:.0f} ms, last fifth "
            f"{scale['python']['last_fifth_p50_ms']:.0f} ms; primary's iterator age p50 "
            f"{scale['iterator_age_ms']['p50']:.0f} ms, max "
            f"{scale['iterator_age_ms']['max']:.0f} ms; primary's invocation p50 / p99 "
            f"{scale['primary_invocation_ms']['p50']:.0f} / "
            f"{scale['primary_invocation_ms']['p99']:.0f} ms; start {scale['world_start_s']} s, "
            f"{scale['python_clients']} subscribes "
            f"{scale['subscribe_all_s']} s; upstream clock pinned to "
            f"±{scale['created_at_uncertainty_ms']} ms."
        )
    lines += [
        "",
        "## 2. Cost per 1,000 delivered messages",
        "",
        "From the fan-out's own EMF documents (both Regions; the secondary has no subscribers "
        "here but still runs for every replicated write). *Delivered* = messages x subscribers "
        "posted.",
        "",
        "| Streams | Batching window | Delivered | Posts / 1,000 | "
        "Invocations / 1,000 (both Regions) | "
        "Primary's invocations / 1,000 | Records per invocation | p50 / p99 latency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scale in measured:
        for label, cost, lat in [
            ("none (template)", scale["cost"], scale["python"]),
            *(
                [
                    (
                        f"{scale['batching']['window_s']} s",
                        scale["batching"]["cost"],
                        scale["batching"]["python"],
                    )
                ]
                if "batching" in scale
                else []
            ),
        ]:
            lines.append(
                f"| {scale['streams']} | {label} | {cost['delivered']:,} | "
                f"{cost['posts_per_1000_delivered']} | {cost['invocations_per_1000_delivered']} | "
                f"{cost['primary_invocations_per_1000_delivered']} | "
                f"{cost['records_per_invocation_primary']} | {lat['p50_ms']:.0f} / "
                f"{lat['p99_ms']:.0f} ms |"
            )
    replay = next((s["replay"] for s in measured if "replay" in s), None)
    lines += ["", "## 3. Replay speed", ""]
    if replay:
        lines.append(
            f"A Python client subscribing `after` {replay['behind']:,} messages behind "
            f"(seeded into the primary's messages table; live streams stopped; "
            f"{replay['replay_max_per_subscribe']:,} messages per subscribe, the client "
            f"subscribes again on `more`): median **{replay['median_msgs_per_s']:,} msg/s** "
            f"({replay['median_s']} s for all of them; runs {replay['runs_s']} s); "
            + (
                "every seq once, in order."
                if not replay["problems"]
                else "PROBLEMS: " + "; ".join(replay["problems"])
            )
            + f" Load average {[round(x, 2) for x in replay['load']]}."
        )
    pauses = figures.get("pauses")
    lines += ["", "## 4. Longest delivery pause per fault", ""]
    if pauses:
        c = pauses["config"]
        drill = "LiveDrillConfig()" if figures["quick"] else "LiveDrillConfig.full()"
        lines += [
            f"`run_live_drill({drill})`, {pauses['runs']} run(s) (ok: {pauses['ok']}): "
            f"{c['streams']} streams at "
            f"{RATE:g} msg/s, {c['python_clients']} Python clients (half through the failover "
            f"name, half pinned to the secondary), {c['browser_pages']} browser page(s); client "
            f"heartbeat {c['heartbeat_s'][0]} s (timeout {c['heartbeat_s'][1]} s), gap timeout "
            f"{c['gap_timeout_s']} s. Medians over the runs (each run's value in brackets).",
            "",
            "| Fault | Python clients | Browser pages | Healed after |",
            "|---|---|---|---|",
        ]
        for fault, entry in pauses["faults"].items():
            py = entry.get("python", {})
            br = entry.get("browser", {})
            lines.append(
                f"| {fault} | {py.get('median_s', '-')} s {py.get('runs', '')} | "
                f"{br.get('median_s', '-')} s {br.get('runs', '')} | {entry['healed_after_s']} s |"
            )
    lines += [
        "",
        "Raw figures:",
        "",
        "```json",
        json.dumps(figures, indent=1, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    log_root = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    figures: dict[str, Any] = {
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "timings": timings(),
        "logs": str(log_root),
        "scales": [],
    }
    log(f"machine {figures['machine']}; logs in {log_root}")
    scales = (
        [int(s) for s in args.scales.split(",")]
        if args.scales
        else ([5] if args.quick else [20, 100])
    )
    for index, streams in enumerate(scales):
        config = ScaleConfig(
            streams=streams,
            warmup=5.0 if args.quick else 15.0,
            seconds=args.seconds or (15.0 if args.quick else 60.0),
            browser_pages=2,
            batching_seconds=(10.0 if args.quick else 40.0)
            if index == 0 and not args.latency_only
            else 0.0,
            replay_runs=(1 if args.quick else 3) if index == 0 and not args.latency_only else 0,
        )
        log(f"scale: {streams} streams x {RATE:g} msg/s x {SUBSCRIBERS_PER_STREAM} subscribers")
        try:
            figures["scales"].append(
                await asyncio.wait_for(measure_scale(config, log_root), args.scale_timeout)
            )
        except Exception as exc:  # a scale this machine cannot run is a finding, not a crash
            reason = f"{type(exc).__name__}: {exc}"[:300]
            log(f"  {streams} streams: not measured: {reason}")
            figures["scales"].append({"streams": streams, "error": reason})
    if args.drill_runs:
        log("pauses: the live drill")
        figures["pauses"] = await measure_pauses(args.drill_runs, args.quick, log_root)
    figures["duration_s"] = time.monotonic() - started
    figures["machine"]["load_at_end"] = pages.load()
    return figures


def results_path(figures: dict[str, Any]) -> Path:
    """Where a run's page goes: the manual's, or for a smoke run (``--quick``), whose figures
    are not the benchmark's, a file next to its logs."""
    return Path(figures["logs"]) / RESULTS.name if figures["quick"] else RESULTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run at a small scale")
    parser.add_argument("--scales", default="", help="streams per run, e.g. 20,100")
    parser.add_argument("--seconds", type=float, default=0.0, help="measurement window")
    parser.add_argument("--drill-runs", type=int, default=None, help="live drill runs (pauses)")
    parser.add_argument(
        "--latency-only", action="store_true", help="no batching-window or replay figure"
    )
    parser.add_argument(
        "--scale-timeout", type=float, default=600.0, help="seconds per scale at most"
    )
    parser.add_argument("--client-pool", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_pool:
        spec = json.loads(sys.stdin.readline())
        asyncio.run(_client_pool(spec))
        return
    if args.drill_runs is None:
        args.drill_runs = 1 if args.quick else 3
    figures = asyncio.run(run(args))
    out = results_path(figures)
    out.write_text(markdown(figures))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()

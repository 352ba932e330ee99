"""The end-to-end drill: upstream -> fleet -> messages table -> fan-out -> clients, under faults.

On :class:`~.e2e.LiveWorld` (the whole system on loopback: fake upstream, real worker
processes, the messages table's real change stream on moto's server, each region's fan-out
from its synthesized asset, both regions' API, canaries and failover resolver), it subscribes
Python clients (:class:`~streamfleet_client.ReconnectingClient`) and browser pages (the demo
page in Debian's Chromium) to the ingested streams: through the failover name, and pinned to
the secondary region's regional URL (served by the secondary's fan-out, from replicated
writes). Then, one after the other:

1. ``kill -9`` of the worker that owns the most watched streams (its streams move to a peer
   after the lease; the peer resumes from the stored log and rewrites what it must);
2. a client's network drop: a Python client's socket is cut without a closing handshake, and a
   page's network goes offline for a while (both reconnect and resume from their position);
3. a regional failover: the primary's handlers are throttled; its canary trips and closes
   every client connection there; the failover name resolves to the secondary; the clients
   that used it reconnect there and resume from their position.

At the end every stream is STOPped and sealed, and every client must have received every seq
from its subscribe point to the last one stored, in order, with no gap and no duplicate
delivered to the application. The report says, for each fault, the longest pause between two
deliveries it caused, per kind of client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfleet import model
from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage
from streamfleet_dev.local.fleet import eventually
from streamfleet_dev.upstream.fake import message_data
from streamfleet_dev.wsapi.browser import BrowserPages, PageSpec, missing_prerequisites
from streamfleet_dev.wsapi.e2e import LiveWorld, WorldSettings, owner_of_most

REPO = Path(__file__).resolve().parents[3]
DIST = REPO / "clients" / "web" / "dist"
FAULTS = ("worker kill -9", "network drop", "regional failover")


@dataclass(frozen=True)
class LiveDrillConfig:
    """The drill's scale and timings (short: ``make test``; full: ``make drill``)."""

    streams: int = 3
    workers: int = 3
    python_clients: int = 4  # even ones through the failover name, odd ones pinned to secondary
    browser_pages: int = 1  # through the failover name
    warmup_messages: int = 5
    settle_seconds: float = 4.0  # after each fault has healed, before the next
    offline_seconds: float = 1.5
    fault_timeout: float = 45.0
    final_timeout: float = 90.0
    heartbeat: tuple[float, float] = (0.5, 0.8)  # clients' heartbeat interval and timeout
    gap_timeout: float = 1.0
    log_dir: Path | None = None

    @classmethod
    def full(cls) -> LiveDrillConfig:
        return cls(streams=6, workers=3, python_clients=8, browser_pages=2, settle_seconds=6.0)


@dataclass
class Delivery:
    seq: int
    at: float  # epoch seconds
    region: str | None
    source: str
    data: str | None = None  # what the application got (browser pages record seqs only)


@dataclass
class Watcher:
    """One subscribed client (Python or a browser page) and what it was delivered."""

    name: str
    kind: str  # "python" or "browser"
    stream: str
    route: str  # "failover name" or the pinned region
    deliveries: list[Delivery] = field(default_factory=list)
    first_after: int | None = None  # the subscribe point (its first subscribed reply)

    def seqs(self) -> list[int]:
        return [d.seq for d in self.deliveries]

    def regions(self) -> list[str]:
        seen: list[str] = []
        for delivery in self.deliveries:
            if delivery.region and (not seen or seen[-1] != delivery.region):
                seen.append(delivery.region)
        return seen

    def longest_pause(self, start: float, end: float) -> tuple[float, float]:
        """The longest time without a delivery that ends in ``(start, end]``, and when it
        began (seconds after ``start``; negative: before it). A pause belongs to the fault
        window it ends in: one that spans the next fault's start is that fault's."""
        times = [d.at for d in self.deliveries]
        longest, began = 0.0, 0.0
        for before, after in itertools.pairwise(times):
            if start < after <= end and after - before > longest:
                longest, began = after - before, before - start
        return longest, began


@dataclass
class FaultRecord:
    name: str
    started: float
    healed: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class LiveDrillReport:
    config: LiveDrillConfig
    faults: list[FaultRecord] = field(default_factory=list)
    watchers: list[Watcher] = field(default_factory=list)
    last_seqs: dict[str, int] = field(default_factory=dict)
    # Each stream's origin (its first owner's starting point): the subscribe point of a client
    # whose subscribe reply named none.
    origins: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    browser: str = ""
    duration_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def pauses(self) -> list[dict[str, Any]]:
        """Per fault: the longest pause each kind of client saw, and who."""
        rows = []
        for index, fault in enumerate(self.faults):
            end = self.faults[index + 1].started if index + 1 < len(self.faults) else fault.healed
            row: dict[str, Any] = {
                "fault": fault.name,
                "healed_after_s": fault.healed - fault.started,
            }
            for kind in ("python", "browser"):
                candidates = [
                    (*w.longest_pause(fault.started, max(end, fault.healed)), w.name)
                    for w in self.watchers
                    if w.kind == kind
                ]
                if candidates:
                    pause, began, who = max(candidates)
                    row[kind] = {
                        "longest_pause_s": round(pause, 3),
                        "began_s": round(began, 3),  # relative to the fault
                        "client": who,
                    }
            rows.append(row)
        return rows

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems[:20],
            "faults": self.pauses(),
            "clients": [
                {
                    "name": w.name,
                    "kind": w.kind,
                    "stream": w.stream,
                    "route": w.route,
                    "delivered": len(w.deliveries),
                    "from": w.seqs()[0] if w.deliveries else None,
                    "to": w.seqs()[-1] if w.deliveries else None,
                    "regions": w.regions(),
                }
                for w in self.watchers
            ],
            "last_seqs": self.last_seqs,
            "browser": self.browser,
            "duration_s": round(self.duration_seconds, 1),
        }


def markdown(report: LiveDrillReport) -> str:
    lines = [
        "| Fault | Healed after | Longest pause, Python clients | Longest pause, browser pages |",
        "|---|---|---|---|",
    ]
    for row in report.pauses():
        python = row.get("python", {})
        browser = row.get("browser", {})
        lines.append(
            f"| {row['fault']} | {row['healed_after_s']:.2f} s | "
            f"{python.get('longest_pause_s', float('nan')):.2f} s ({python.get('client', '-')}) | "
            f"{browser.get('longest_pause_s', float('nan')):.2f} s ({browser.get('client', '-')}) |"
        )
    delivered = sum(len(w.deliveries) for w in report.watchers)
    verdict = (
        "every seq once, in order, no gap"
        if report.ok
        else "PROBLEMS: " + "; ".join(report.problems[:5])
    )
    lines.append("")
    lines.append(f"{len(report.watchers)} clients, {delivered} messages delivered: {verdict}")
    return "\n".join(lines)


async def _until(
    predicate: Callable[[], Awaitable[bool] | bool], timeout: float, what: str
) -> float:
    """When ``predicate`` first held (epoch seconds); ``TimeoutError`` naming ``what``."""
    try:
        await eventually(predicate, timeout=timeout, what=what)
    except AssertionError:
        raise TimeoutError(f"live drill: {what} did not happen within {timeout:g} s") from None
    return time.time()


class LiveDrill:
    """One run (see the module docstring)."""

    def __init__(self, config: LiveDrillConfig):
        self.config = config
        self.report = LiveDrillReport(config)
        self.world: LiveWorld | None = None
        self.clients: list[tuple[Watcher, ReconnectingClient]] = []
        self.browser: BrowserPages | None = None
        self.pages: list[Watcher] = []

    # Clients ---------------------------------------------------------------------------------

    def _python_client(self, index: int, stream: str) -> tuple[Watcher, ReconnectingClient]:
        world = self.world
        assert world is not None and world.regions is not None
        regions = world.regions
        pinned = regions.settings.secondary if index % 2 else None
        user = f"py-{index:02d}"
        watcher = Watcher(user, "python", stream, pinned or "failover name")

        def provider(attempt: int, *, force_refresh: bool = False) -> Endpoint:
            url = regions.region_url(pinned) if pinned else regions.resolve()["url"]
            return Endpoint(url, regions.mint_token(user, expires_in=600))

        def delivered(message: StreamMessage) -> None:
            watcher.deliveries.append(
                Delivery(message.seq, time.time(), message.region, message.source, message.data)
            )

        def replied(message: dict[str, Any]) -> None:
            if message.get("type") == "subscribed" and watcher.first_after is None:
                watcher.first_after = message.get("after")

        interval, timeout = self.config.heartbeat
        client = ReconnectingClient(
            provider,
            ClientConfig(
                heartbeat_interval=interval,
                heartbeat_timeout=timeout,
                backoff_base=0.1,
                backoff_cap=1.0,
                open_timeout=3.0,
                request_timeout=5.0,
                gap_timeout=self.config.gap_timeout,
            ),
            on_stream_message=delivered,
            on_message=replied,
            name=user,
        )
        return watcher, client

    async def _read_pages(self) -> None:
        if self.browser is None:
            return
        for watcher, page in zip(self.pages, await self.browser.read(), strict=True):
            watcher.deliveries = [
                Delivery(seq, at / 1000, None, "")
                for seq, at in zip(page["seqs"], page["deliveredAtMs"], strict=False)
            ]
            watcher.first_after = page.get("startedAfter")
            regions = page.get("region")
            if regions and watcher.deliveries:
                watcher.deliveries[-1].region = regions

    def _watchers(self) -> list[Watcher]:
        return [w for w, _ in self.clients] + self.pages

    async def _all_progress(self, since: dict[str, int], more: int = 3) -> bool:
        await self._read_pages()
        return all(len(w.deliveries) >= since.get(w.name, 0) + more for w in self._watchers())

    def _counts(self) -> dict[str, int]:
        return {w.name: len(w.deliveries) for w in self._watchers()}

    # The run ---------------------------------------------------------------------------------

    async def run(self) -> LiveDrillReport:
        config = self.config
        started = time.monotonic()
        use_browser = config.browser_pages > 0 and not missing_prerequisites()
        settings = WorldSettings(
            streams=config.streams,
            workers=config.workers,
            static_dir=DIST if use_browser else None,
            log_dir=config.log_dir,
        )
        async with LiveWorld(settings) as world:
            self.world = world
            assert world.regions is not None
            await world.wait_live(60)
            streams = world.stream_ids
            for index in range(config.python_clients):
                watcher, client = self._python_client(index, streams[index % len(streams)])
                self.clients.append((watcher, client))
            async with contextlib.AsyncExitStack() as stack:
                for _, client in self.clients:
                    await stack.enter_async_context(client)
                for watcher, client in self.clients:
                    await client.wait_ready(20)
                    await client.subscribe(watcher.stream)
                if use_browser:
                    specs = [
                        PageSpec(f"page-{index:02d}", streams[index % len(streams)])
                        for index in range(config.browser_pages)
                    ]
                    self.pages = [
                        Watcher(spec.user, "browser", spec.stream, "failover name")
                        for spec in specs
                    ]
                    self.browser = await stack.enter_async_context(
                        BrowserPages(world.regions.http_url, specs, world.log_dir / "browser")
                    )
                    self.report.browser = self.browser.browser_version
                await _until(
                    lambda: self._all_progress({}, config.warmup_messages),
                    config.fault_timeout,
                    "every client receiving",
                )
                await self._kill_a_worker()
                await self._drop_networks()
                await self._fail_over()
                await self._finish()
        self.report.watchers = self._watchers()
        self.report.duration_seconds = time.monotonic() - started
        self._check()
        return self.report

    async def _heal(self, fault: FaultRecord, what: str) -> None:
        counts = self._counts()
        fault.healed = await _until(
            lambda: self._all_progress(counts), self.config.fault_timeout, what
        )
        self.report.faults.append(fault)
        await asyncio.sleep(self.config.settle_seconds)

    async def _kill_a_worker(self) -> None:
        world = self.world
        assert world is not None
        owners = await asyncio.to_thread(world.owners)
        watched = {w.stream for w in self._watchers()}
        victim = owner_of_most({s: o for s, o in owners.items() if s in watched})
        fault = FaultRecord(FAULTS[0], time.time(), 0.0, {"worker": victim})
        world.kill_worker(victim)
        moved = [s for s, o in owners.items() if o == victim]
        await _until(
            lambda: all(o not in (None, victim) for s, o in world.owners().items() if s in moved),
            self.config.fault_timeout,
            f"{victim}'s streams to move",
        )
        fault.detail["streams"] = moved
        await self._heal(fault, "deliveries after the kill")

    async def _drop_networks(self) -> None:
        fault = FaultRecord(FAULTS[1], time.time(), 0.0)
        _, client = self.clients[0]
        fault.detail["python"] = self.clients[0][0].name
        client.abort_connection()
        if self.browser is not None:
            fault.detail["browser"] = self.pages[0].name
            await self.browser.offline(0, self.config.offline_seconds)
        await self._heal(fault, "deliveries after the network drop")

    async def _fail_over(self) -> None:
        world = self.world
        assert world is not None and world.regions is not None
        regions = world.regions
        fault = FaultRecord(FAULTS[2], time.time(), 0.0)
        await regions.fail_primary("throttled")
        secondary = regions.settings.secondary
        await _until(
            lambda: regions.serving_region() == secondary,
            self.config.fault_timeout,
            "the failover name to resolve to the secondary",
        )
        fault.detail["dns_switched_after_s"] = round(time.time() - fault.started, 3)
        moving = [w for w, c in self.clients if w.route == "failover name"]

        def moved() -> bool:
            return all(c.region == secondary for w, c in self.clients if w in moving)

        await _until(moved, self.config.fault_timeout, "the clients to move to the secondary")
        await self._heal(fault, "deliveries from the secondary")
        await self._read_pages()
        fault.detail["pages_on"] = [p.regions()[-1:] for p in self.pages]

    async def _finish(self) -> None:
        world = self.world
        assert world is not None
        await world.stop_streams(world.stream_ids)
        self.report.last_seqs = await world.wait_sealed(self.config.final_timeout)
        for stream in world.stream_ids:
            row = await asyncio.to_thread(world.row, stream)
            origin = row.get(model.ORIGIN_SEQ)
            self.report.origins[stream] = int(origin) if origin is not None else None

        async def caught_up() -> bool:
            await self._read_pages()
            return all(
                w.deliveries and w.deliveries[-1].seq >= self.report.last_seqs[w.stream]
                for w in self._watchers()
            )

        try:
            await _until(caught_up, self.config.final_timeout, "every client to catch up")
        except TimeoutError as exc:
            self.report.problems.append(str(exc))
        await self._read_pages()

    def _check(self) -> None:
        for watcher in self._watchers():
            seqs = watcher.seqs()
            last = self.report.last_seqs.get(watcher.stream)
            if not seqs:
                self.report.problems.append(f"{watcher.name}: nothing delivered")
                continue
            # Where its log must start: after its subscribe point, or after the stream's
            # origin when the reply named none; never its own first delivery (blind to a gap
            # at the start).
            after = watcher.first_after
            if not isinstance(after, int):
                after = self.report.origins.get(watcher.stream)
            if not isinstance(after, int):
                self.report.problems.append(f"{watcher.name}: no subscribe point to check from")
                continue
            start = after + 1
            wrong = [
                d.seq
                for d in watcher.deliveries
                if d.data is not None and d.data != message_data(watcher.stream, d.seq)
            ]
            if wrong:
                self.report.problems.append(
                    f"{watcher.name} ({watcher.stream}): not what the upstream sent at {wrong[:10]}"
                )
            expected = list(range(start, (last or seqs[-1]) + 1))
            if seqs != expected:
                duplicates = len(seqs) - len(set(seqs))
                missing = sorted(set(expected) - set(seqs))[:10]
                self.report.problems.append(
                    f"{watcher.name} ({watcher.stream}): {len(seqs)} delivered, expected "
                    f"{start}..{last}; duplicates {duplicates}, missing {missing}"
                )


async def run_live_drill(config: LiveDrillConfig) -> LiveDrillReport:
    """Run the drill once; the report (``report.ok`` and ``report.problems`` say how it went)."""
    return await LiveDrill(config).run()

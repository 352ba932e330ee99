"""The checks every simulated schedule ends with: one owner, liveness, exactly once.

* **One owner**: for each stream, the holder windows of successive leases never overlap. A
  window runs from the moment a worker holds the lease (the claim answered) to the moment it
  stops acting on it: it stops receiving from the upstream and sends its last message write,
  or earlier, the moment its own holder's deadline passed (a frozen or cut-off worker has
  promised to stop by then). A killed worker acts until its kill took effect at the latest (a
  window it never got to close otherwise looks open until the deadline, although the release
  it sent had been applied). Its fenced writes to the lease table may come later (a release);
  they change nothing once someone else holds the lease, so they do not count. No message write
  is sent after the deadline or after the release. The upstream never has two clients dialled
  with the current epoch of a stream.
* **Liveness**: after the last fault every STARTED stream is owned and connected, and every
  STOPPED one closed, within :func:`liveness_bound`.
* **Exactly once from the origin**: once every stream is stopped and sealed, its stored seqs are
  exactly ``origin + 1 .. newest`` with the upstream's content (:mod:`streamfleet_dev.checks`).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from streamfleet import model
from streamfleet_dev.checks import log_problems
from streamfleet_dev.sim.faults import WRITES, Sent
from streamfleet_dev.sim.world import SimTiming, Window, World, eventually
from streamfleet_dev.upstream.fake import message_data


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


# A schedule that settles after the bound but within this many bounds is reported as late
# (its seed and what was not back at the bound, in the summary), not failed: on 2 shared cores
# about one schedule in a hundred takes longer than the bound, and a late recovery is not a
# stuck one. One that is not back within LATE_FACTOR bounds fails liveness.
LATE_FACTOR = 3
# The final STOPs must have sealed and released every stream within STOP_FACTOR bounds: 10 x
# the usual second or two, and past one seal whose refill timed out (REFILL_SECONDS), then a
# release retried and a second seal.
STOP_FACTOR = 10


def liveness_bound(timing: SimTiming) -> float:
    """How long after the last fault every stream must be back. The slowest paths: a dead
    owner's session expires (lease + skew after its last renewal) and a peer's reconcile wakes
    for it; a worker that sat out an outage reopens its session (a heartbeat) and reconciles
    again at once; rows of a dead peer left to others by the fair share are taken by anyone
    once they are two reconcile intervals old; a stopped row whose owner died is sealed by the
    worker that claims it. Three leases and three reconcile intervals cover every combination
    of two of these (the simulation's load slows every loop a little: 2 cores, many workers).
    """
    return (
        3 * (timing.lease_seconds + timing.max_clock_skew_seconds)
        + 3 * timing.reconcile_every
        + timing.heartbeat_seconds
    )


def _pks_written(sent: Sent) -> set[str]:
    """The connection keys a write touches (lease table or messages table)."""
    params = sent.params
    if sent.operation == "batch_write_item":
        found = set()
        for requests in params.get("RequestItems", {}).values():
            for request in requests:
                body = request.get("PutRequest", {}).get("Item") or request.get(
                    "DeleteRequest", {}
                ).get("Key", {})
                pk = body.get(model.PK, {}).get("S")
                if pk:
                    found.add(pk)
        return found
    pk = params.get("Key", {}).get(model.PK, {}).get("S")
    return {pk} if pk else set()


def _is_claim(sent: Sent) -> bool:
    return "ADD #lease_version" in sent.params.get("UpdateExpression", "")


def _deadline_end(world: World, window: Window) -> float:
    """The last holder's deadline the worker ever believed for that session.

    A deadline that passed and then moved again (a renewal answered just after the previous
    deadline, the watchdog not yet awake) is safe to act on: the renewal was applied before any
    taker could fence the session, or it would have failed. Acting past the *last* deadline,
    with no successful renewal after it, is what the holder promised never to do.
    """
    values = world.history.deadlines.get((window.worker, window.session_version), [])
    finite = [value for _, value in values if value != float("-inf")]
    return max(finite, default=window.began)


def one_owner_problems(world: World) -> list[str]:
    problems: list[str] = []
    history = world.history
    message_writes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sent in history.sent:
        if sent.operation not in WRITES or _is_claim(sent):
            continue
        worker = sent.client.split("/", 1)[0]
        if sent.operation != "batch_write_item":
            continue
        for pk in _pks_written(sent):
            message_writes[(worker, pk)].append(sent.at)
    now = time.monotonic()
    by_pk: dict[str, list[Window]] = defaultdict(list)
    for window in history.windows:
        by_pk[window.pk].append(window)
    spans: dict[int, tuple[float, float]] = {}
    killed = {w.worker_id: w.killed_at for w in world.workers.values() if w.killed_at is not None}
    for pk, windows in by_pk.items():
        windows.sort(key=lambda w: w.began)
        for n, window in enumerate(windows):
            # Acting ends when it stopped receiving and sent its last message write before its
            # next window, or when its deadline passed, whichever comes first.
            later = [w.began for w in windows[n + 1 :] if w.worker == window.worker]
            horizon = min(later, default=now)
            last_write = max(
                (t for t in message_writes[(window.worker, pk)] if window.began <= t < horizon),
                default=window.began,
            )
            acting = max(last_write, window.stopped or window.began)
            if window.finished is None:
                # Killed: until the kill took effect (nothing it sends leaves after it, and its
                # sockets are reset), even when the kill came after a release it never got to
                # record. Still running: until now. Either way no later than the deadline.
                killed_at = killed.get(window.worker)
                if killed_at is None or window.stopped is None:
                    acting = max(acting, min(now if killed_at is None else killed_at, horizon))
            end = min(acting, _deadline_end(world, window))
            spans[id(window)] = (window.began, end)
        previous: Window | None = None
        for window in windows:
            began, _ = spans[id(window)]
            if previous is not None:
                _, previous_end = spans[id(previous)]
                if began < previous_end:
                    problems.append(
                        f"{pk}: {window.worker} (lease {window.lease_version}) held it from "
                        f"{began:.3f} while {previous.worker} (lease {previous.lease_version}) "
                        f"still acted until {previous_end:.3f}"
                    )
            if previous is None or spans[id(window)][1] > spans[id(previous)][1]:
                previous = window
    for pk, windows in by_pk.items():
        for window in windows:
            if window.finished is None:
                continue
            later = [
                w.began for w in windows if w.worker == window.worker and w.began > window.began
            ]
            after = [
                t
                for t in message_writes[(window.worker, pk)]
                if window.finished < t < min(later, default=now)
            ]
            if after:
                problems.append(
                    f"{pk}: {window.worker} sent {len(after)} message writes after releasing lease "
                    f"{window.lease_version}"
                )
    for (worker, pk), times in message_writes.items():
        mine = [spans[id(w)] for w in by_pk.get(pk, []) if w.worker == worker]
        outside = [t for t in times if not any(b <= t <= e for b, e in mine)]
        if outside:
            problems.append(
                f"{pk}: {worker} sent {len(outside)} message writes outside its holder window"
            )
    stats = world.upstream.stats()
    prefix = f"{world.name}-"
    for stream, count in stats["overlaps"].items():
        if stream.startswith(prefix) and count:
            problems.append(f"{stream}: the upstream had two clients with its current epoch")
    return problems


def _live(world: World, rows: dict[str, dict], stream: str, connected: dict[str, int]) -> bool:
    row = rows.get(stream, {})
    return row.get(model.LEASE_OWNER) is not None and connected.get(stream) == 1


def _log_problems(world: World, streams: list[str]) -> list[str]:
    rows = world.rows()
    problems: list[str] = []
    for stream in streams:
        problems += log_problems(
            stream, rows.get(stream), world.stored_log(stream), message_data, final=True
        )
    return problems


async def check_world(world: World, *, started: set[str], all_streams: list[str]) -> Verdict:
    verdict = Verdict()
    timing = world.timing
    bound = liveness_bound(timing)
    began = time.monotonic()

    def settled_now() -> bool:
        rows = world.rows()
        connected = world.upstream.stats()["connected"]
        desired = {
            s: rows.get(s, {}).get(model.DESIRED_STATE) == model.DesiredState.STARTED.value
            for s in all_streams
        }
        return all(
            _live(world, rows, s, connected)
            if desired[s]
            else rows.get(s, {}).get(model.LEASE_OWNER) is None and not connected.get(s)
            for s in all_streams
        )

    async def settled() -> bool:  # table and upstream reads off the event loop
        return await asyncio.to_thread(settled_now)

    def stuck() -> dict[str, tuple[Any, Any, int]]:
        rows = world.rows()
        connected = world.upstream.stats()["connected"]
        return {
            s: (
                rows.get(s, {}).get(model.DESIRED_STATE),
                rows.get(s, {}).get(model.LEASE_OWNER),
                connected.get(s, 0),
            )
            for s in all_streams
        }

    if await eventually(settled, timeout=bound):
        verdict.facts["recovered_in"] = round(time.monotonic() - began, 3)
    else:
        at_bound = await asyncio.to_thread(stuck)
        if await eventually(settled, timeout=(LATE_FACTOR - 1) * bound):
            verdict.facts["recovered_in"] = round(time.monotonic() - began, 3)
            verdict.facts["late"] = (
                f"settled {verdict.facts['recovered_in']} s after the last fault, past the "
                f"{bound:.1f} s bound; at the bound: {at_bound}"
            )
        else:
            verdict.problems.append(
                f"liveness: not settled within {LATE_FACTOR * bound:.1f} s "
                f"({LATE_FACTOR} x the bound): {await asyncio.to_thread(stuck)}"
            )
    # Stop everything; each final owner flushes, seals and releases.
    stops = await asyncio.gather(
        *(world.stop_stream(s) for s in all_streams), return_exceptions=True
    )
    verdict.problems += [
        f"stop of {stream} failed: {result!r}"
        for stream, result in zip(all_streams, stops, strict=True)
        if isinstance(result, BaseException)
    ]

    def sealed_now() -> bool:
        return all(
            model.LEASE_OWNER not in row
            and model.UNSEALED not in row
            and model.AWAITING_OWNER not in row
            for row in world.rows().values()
        )

    async def sealed() -> bool:
        return await asyncio.to_thread(sealed_now)

    # A seal may have the upstream replay a hole for up to REFILL_SECONDS, and a seal or a
    # release that fails leaves the row claimable for another attempt: no liveness bound.
    stop_bound = STOP_FACTOR * bound
    if not await eventually(sealed, timeout=stop_bound):
        unsealed = {
            stream: row
            for stream, row in (await asyncio.to_thread(world.rows)).items()
            if {model.LEASE_OWNER, model.UNSEALED, model.AWAITING_OWNER} & row.keys()
        }
        verdict.problems.append(
            f"stop: not every stream released and sealed within {stop_bound:.0f} s: {unsealed}"
        )
    await asyncio.to_thread(world.network.quiesce)
    verdict.problems += await asyncio.to_thread(one_owner_problems, world)
    verdict.problems += await asyncio.to_thread(_log_problems, world, all_streams)
    for worker in world.workers.values():
        if worker.error is not None:
            verdict.problems.append(f"{worker.worker_id} crashed: {worker.error!r}")
    verdict.facts["streams_started"] = sorted(started)
    return verdict

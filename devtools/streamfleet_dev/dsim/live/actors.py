"""The fleet's side of a schedule: upstreams stored as the sink stores them, START and
readers changes, and the event source that invokes the fan-out."""

from __future__ import annotations

import json
import random
from typing import Any

from streamfleet import model
from streamfleet.lease.dynamo import to_attr
from streamfleet.worker.protocol import UpstreamMessage
from streamfleet.wsapi import fanout as fanout_module
from streamfleet.wsapi.delivery import SOURCE_LIVE, pack_frames
from streamfleet_dev.dsim.live.region import Region
from streamfleet_dev.dsim.live.world import SETTLE_S, World, until_answered

FANOUT_TIMEOUT_S = 60.0
FANOUT_RETRIES = 2  # a batch is given up after this many retries (the clients' gap watch heals)

# --- Upstreams, control and the event source -----------------------------------------------------


class Upstream:
    """One stream's messages as its worker stores them, until the schedule's end: now and then
    a seq stored again (a worker that resumed), a new epoch (the upstream restarted its
    numbering), or two messages stored out of order (a batch that landed in part and was
    retried: the log has a hole for a while)."""

    def __init__(self, world: World, stream: str):
        self._world = world
        self._rng = random.Random(f"upstream-{world.schedule.seed}-{stream}")
        self._pk = model.connection_pk(stream)
        self._epoch, self._seq, self._prev = 0, 0, None
        self._prev_expires_at: int | None = None  # when the message before the next expires
        self._last: dict[str, Any] | None = None

    def run(self) -> None:
        world, rng, schedule = self._world, self._rng, self._world.schedule
        while world.scheduler.now < schedule.duration:
            world.scheduler.sleep(rng.expovariate(1.0 / schedule.message_every))
            if self._last is not None and rng.random() < schedule.rewrite_share:
                # Received again by a worker that resumed: the same message, a new receipt.
                items = [{**self._last, model.MESSAGE_RECEIVED_AT_MS: to_attr(world.now_ms)}]
            elif rng.random() < schedule.hole_share:
                first, second = self._next(), self._next()
                items = [second, first]
            else:
                items = [self._next()]
            for index, item in enumerate(items):
                if index:
                    world.scheduler.sleep(rng.uniform(0.01, 2.0))
                self._store(item)
            self._last = items[-1]

    def store_large(self) -> None:
        """A message too big for one frame, now (the adversary's: while a subscribe of the
        stream is handled, its replay and the live path may both carry it, in parts)."""
        self._store(self._next(large_share=1.0))

    def _next(self, large_share: float | None = None) -> dict[str, Any]:
        rng, schedule = self._rng, self._world.schedule
        if self._seq and rng.random() < schedule.restart_share:
            # The new epoch's first message follows the old epoch's last (as the worker's
            # connection stores it).
            self._epoch, self._seq = self._epoch + 1, 0
        self._seq += 1
        position = model.log_position(self._epoch, self._seq)
        share = schedule.large_share if large_share is None else large_share
        message = UpstreamMessage(position, *_payload(rng, share, self._seq))
        plain = self._world.sink.item(
            self._pk, message, self._world.now_ms, self._prev, self._prev_expires_at
        )
        self._prev, self._prev_expires_at = position, plain.get(model.MESSAGE_EXPIRES_AT)
        return {name: to_attr(value) for name, value in plain.items()}

    def _store(self, item: dict[str, Any]) -> None:
        world = self._world
        until_answered(
            lambda: world.worker_db.put_item(TableName=world.names["messages"], Item=item)
        )


# Every byte value to a character of text that JSON escapes or encodes in several bytes.
_LARGE_ALPHABET = {byte: 'ab"\\\u00e9\u20ac\U0001f600 \n'[byte % 9] for byte in range(256)}


def _payload(rng: random.Random, large_share: float, seq: int) -> tuple[str, bool]:
    """A message's data and whether it is JSON text: short strings with escapes and non-ASCII
    characters, JSON values, now and then one too big for a frame."""
    if rng.random() < large_share:
        size = rng.randint(model.WS_MAX_FRAME_BYTES, 3 * model.WS_MAX_FRAME_BYTES)
        # A seeded byte a character, mapped onto the alphabet: as random as drawing each
        # character, in a fraction of the time.
        return rng.randbytes(size // 2).decode("latin-1").translate(_LARGE_ALPHABET), False
    if rng.random() < 0.2:
        return json.dumps({"n": seq, "v": [rng.random(), "\u00e9"]}, separators=(",", ":")), True
    return f"m{seq} " + "".join(rng.choices('xyz"\\\u00e9\U0001f600', k=8)), False


def run_control(world: World) -> None:
    """START: each stream's readers (both groups) and origin; then the schedule's readers
    changes, each excluding one group for a while or for good."""
    world.readers.start()
    changes = sorted(
        [(begins, stream, group, True) for stream, group, begins, _ in world.schedule.revocations]
        + [
            (ends, stream, group, False)
            for stream, group, _, ends in world.schedule.revocations
            if ends is not None
        ]
    )
    for when, stream, group, exclude in changes:
        world.scheduler.sleep(max(0.0, when - world.scheduler.now))
        world.readers.change(stream, group, exclude=exclude)


def run_ttl(world: World) -> None:
    """DynamoDB's TTL: now and then, the items whose time has passed are deleted (each a
    ``REMOVE`` record in the change stream); an expired item stays readable until then, as in
    DynamoDB, where the deletion comes some time after the expiry."""
    rng = random.Random(f"ttl-{world.schedule.seed}")
    while world.scheduler.now < world.schedule.duration + SETTLE_S:
        world.scheduler.sleep(rng.uniform(0.2, 3.0))
        world.expire(world.now_ms / 1000 - rng.uniform(0.0, 2.0))


def run_event_source(world: World, region: Region) -> None:
    """Lambda's DynamoDB event source in ``region``: its replica's change stream in order, in
    batches of seeded sizes; a failed invocation's batch retried, then given up."""
    seed = world.schedule.seed
    rng = random.Random(f"events-{seed}" if region.primary else f"events-{seed}-{region.name}")
    shard = region.store.stream_records(region.names["messages"])
    where = "" if region.primary else f"{region.name} "
    position = 0
    while True:
        world.scheduler.sleep(rng.uniform(0.05, 0.5))
        records = shard()
        if position >= len(records):
            if world.scheduler.now > world.schedule.duration + SETTLE_S:
                return
            continue
        batch = records[position : position + rng.randint(1, world.schedule.max_batch)]
        for attempt in range(FANOUT_RETRIES + 1):
            if _invoke_fanout(world, region, batch, rng):
                break
            world.note(f"{where}fan-out batch of {len(batch)} failed (attempt {attempt + 1})")
        else:
            world.note(f"{where}fan-out batch of {len(batch)} given up")
        position += len(batch)


def _invoke_fanout(
    world: World, region: Region, batch: list[dict[str, Any]], rng: random.Random
) -> bool:
    region.fanout_calls.clear()
    crash_after = None
    if world.faults_on and rng.random() < world.schedule.crash_share:
        world.faults += 1
        crash_after = rng.uniform(0, 0.1)
    ok, _ = world.invoke(
        region.fanout,
        {"Records": batch},
        timeout=FANOUT_TIMEOUT_S,
        name="fanout" if region.primary else f"fanout-{region.name}",
        crash_after=crash_after,
    )
    if not ok:
        return False
    # A subscriber's frames of every stream of the batch, each tried at most _MAX_POST_ATTEMPTS
    # times, then its close and a close of its revocation: what one invocation may send one
    # connection.
    frames = sum(
        len(pack_frames(stream, messages, region=region.name, source=SOURCE_LIVE))
        for stream, messages in fanout_module.messages_by_stream(batch).items()
    )
    bound = frames * fanout_module._MAX_POST_ATTEMPTS + 2
    for connection_id, made in sorted(region.fanout_calls.items()):
        if made > bound:
            world.problem(
                f"a fan-out invocation made {made} Management API calls for {connection_id} "
                f"(bound {bound})"
            )
    return True

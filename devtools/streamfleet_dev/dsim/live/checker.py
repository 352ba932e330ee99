"""What each client's application received, checked against the stored log; what each
connection was posted, checked against who could read it then."""

from __future__ import annotations

import bisect

from streamfleet import model
from streamfleet_dev.dsim.live.client import AppLog, Client
from streamfleet_dev.dsim.live.liveness import check_cut_off_connections_given_up
from streamfleet_dev.dsim.live.restarts import check_restarted_clients_resubscribed
from streamfleet_dev.dsim.live.schedule import ClientPlan
from streamfleet_dev.dsim.live.world import REPLAYED_DATA_BOUND, Stored, World


def check(world: World, clients: list[Client]) -> int:
    """Record every problem of the run in ``world``; how many messages were delivered."""
    delivered = 0
    for client in clients:
        for stream, app in sorted(client.apps.items()):
            delivered += sum(1 for event in app.events if event[0] == "message")
            _check_app(world, client, stream, app)
    _check_revocations(world, {c.plan.user: c.plan for c in clients})
    check_cut_off_connections_given_up(world)
    check_restarted_clients_resubscribed(world, clients)
    for task, sent in world.replayed_bytes.items():
        if sent > REPLAYED_DATA_BOUND:
            world.problem(
                f"{task.name} posted {sent} bytes of message data (bound {REPLAYED_DATA_BOUND})"
            )
    return delivered


def _check_app(world: World, client: Client, stream: str, app: AppLog) -> None:
    who = f"{client.plan.user} {stream}"
    log = [stored for _, stored in sorted(world.log[stream].items())]
    positions = [stored.position for stored in log]
    index: int | None = None  # in ``log``, of the next message the application must receive
    epoch = 0
    last: int | None = None  # the last position delivered
    for event in app.events:
        if event[0] == "start":
            start = model.log_position(event[1], event[2])
            if last is not None and start < last:
                world.problem(
                    f"{who}: a subscription began at {event[1]}/{event[2]}, before "
                    "what was delivered"
                )
                return
            index, epoch = bisect.bisect_right(positions, start), event[1]
            continue
        if index is None:
            world.problem(f"{who}: delivered before its subscribe point was known")
            return
        if event[0] == "epoch":
            # What TTL deleted of the older epoch is passed over: the change is what the
            # application is told (a skip counts seqs within one epoch).
            while index < len(log) and model.epoch_of(log[index].position) < event[1]:
                if not log[index].expired:
                    break
                index += 1
            if index >= len(log) or model.epoch_of(log[index].position) != event[1]:
                world.problem(f"{who}: epoch change to {event[1]} out of place")
                return
            epoch = event[1]
            continue
        if event[0] == "skip":
            # Only what TTL deleted may be skipped: a seq the log holds (or will hold: a hole
            # still being filled) must be delivered.
            _, skip_epoch, after, to = event
            end = model.log_position(skip_epoch, to)
            kept = [e for e in log[index:] if e.position <= end and not e.expired]
            if kept:
                held = kept[0].position
                world.problem(
                    f"{who}: skipped {skip_epoch}/{after + 1}..{to} though the log holds "
                    f"{model.epoch_of(held)}/{model.seq_of(held)}"
                )
                return
            index = bisect.bisect_right(positions, end)
            continue
        _, got_epoch, seq, data, is_json = event
        if index >= len(log):
            world.problem(f"{who}: delivered {got_epoch}/{seq} past the end of the log")
            return
        want = log[index]
        want_epoch, want_seq = model.epoch_of(want.position), model.seq_of(want.position)
        if (got_epoch, seq) != (want_epoch, want_seq):
            world.problem(
                f"{who}: delivered {got_epoch}/{seq} where the log has {want_epoch}/{want_seq}"
            )
            return
        if got_epoch != epoch:
            world.problem(f"{who}: {got_epoch}/{seq} delivered without its epoch change")
            return
        if (data, is_json) != (want.data, want.json):
            world.problem(f"{who}: {got_epoch}/{seq} delivered with other bytes than stored")
            return
        last = want.position
        index += 1
    still_reading = stream in client.subscriptions and stream not in client.refused
    # What TTL deleted may be missing: at the end of the log nothing follows it to tell.
    missing = [e for e in log[index:] if not e.expired] if index is not None else []
    missing = _owed_by(world, client, stream, missing)
    if still_reading and missing:
        world.problem(
            f"{who}: {len(missing)} stored messages never delivered, from "
            f"{model.epoch_of(missing[0].position)}/{model.seq_of(missing[0].position)}"
        )


def _owed_by(world: World, client: Client, stream: str, missing: list[Stored]) -> list[Stored]:
    """What of ``missing`` the client still reading at the end is owed: all of it, unless it
    reads from a Region other than the primary, which can serve only what replicated there. A
    message the primary stored and never replicated (it was cut off, and has not recovered)
    is a hole there that nothing fills, so the client is owed the log up to it, and no more
    (disaster-recovery.md: those messages reach the other Region when the failed one
    recovers; live-delivery.md: a hole that may still be filled is never skipped)."""
    region = (
        client.connection.gateway.region
        if client.connection
        else world.region_for(client.plan.user)
    )
    if region.primary:
        return missing
    for index, stored in enumerate(missing):
        if not region.holds(stream, stored.position):
            return missing[:index]
    return missing


def _check_revocations(world: World, plans: dict[str, ClientPlan]) -> None:
    for connection_id, posted in sorted(world.posted.items()):
        group = plans[posted.user].group
        for stream, position, posted_ms in posted.positions:
            stored = world.log[stream].get(position)
            if stored is None:
                continue
            # Each Region's handlers and fan-out read its own replica of the readers: in the
            # secondary, a readers change holds once it has replicated there.
            for begun, until in posted.region.excluded.get((stream, group), ()):
                if stored.stored_at_ms > begun and (until is None or posted_ms < until):
                    world.problem(
                        f"{connection_id} ({posted.user}): {stream} {_wire(position)}, stored "
                        "after its readers excluded the user, was posted to it while they did"
                    )
                    return
            if stored.stored_at_ms >= posted.token_expires_at * 1000:
                world.problem(
                    f"{connection_id} ({posted.user}): {stream} {_wire(position)} stored after "
                    "its token expired was posted to it"
                )
                return


def _wire(position: int) -> str:
    """A log position as the trace writes them: ``epoch/seq``."""
    return f"{model.epoch_of(position)}/{model.seq_of(position)}"

"""The STOPPED-task path end to end: real worker processes (from the synthesized task
definition), each with a task ARN from a local task metadata endpoint, and the synthesized
handler from its asset getting the event ECS would send when a worker process exits.

* a ``kill -9``: every stream of the dead worker lives elsewhere long before its session could
  have expired (the lease path cannot do that), claimed through intake;
* a *forged* STOPPED event for a worker that is only frozen (SIGSTOP): its session is ended, its
  streams move to a peer, and when it wakes its renewal finds the session ENDED (SessionLost)
  and it closes its connections; the upstream never has two clients with the current epoch. A
  wrong event costs availability, never double ownership.

Bounds are correctness bounds; the speed figures come from ``bench/task_events_bench.py``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest

from streamfleet import model
from streamfleet_dev.local.fleet import Fleet, WorkerProcess, eventually
from streamfleet_dev.upstream.fake import FakeUpstream

pytestmark = pytest.mark.slow

# A lease long enough that "before the lease could have done it" is unmistakable, and that a
# worker frozen for a second wakes well before its holder's deadline.
LEASE_SECONDS = 8.0
TIMING = {
    "LEASE_SECONDS": str(LEASE_SECONDS),
    "HEARTBEAT_EVERY": "1",
    "MAX_CLOCK_SKEW_SECONDS": "0.5",
    "SAFETY_MARGIN_SECONDS": "0.5",
    # Reconcile as rarely as production does relative to the lease: the claims here come from
    # the notifications, not from a scan.
    "RECONCILE_EVERY": "4",
}


@pytest.fixture
async def fleet(moto, servers, tmp_path, monkeypatch) -> AsyncIterator[Fleet]:
    # DynamoDB on dynalite (it serialises conditional writes), SQS on moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    async with FakeUpstream(rate=20, keepalive_seconds=0.3) as upstream:
        fleet = Fleet(
            endpoint=servers["dynalite"].endpoint,
            upstream=upstream,
            tmp=tmp_path,
            extra_env=TIMING,
            task_events=True,
        )
        try:
            yield fleet
        finally:
            fleet.close()


def start(fleet: Fleet, count: int) -> list[WorkerProcess]:
    workers = []
    for _ in range(count):
        worker_id = f"w{len(fleet.workers) + 1}"
        workers.append(fleet.start_worker(worker_id, **fleet.task_env(worker_id)))
    return workers


def streams(n: int) -> list[str]:
    return [f"s{i:03d}" for i in range(n)]


def busiest(fleet: Fleet, workers: list[WorkerProcess]) -> tuple[WorkerProcess, list[str]]:
    owners = fleet.owners()
    worker = max(workers, key=lambda w: sum(o == w.worker_id for o in owners.values()))
    return worker, sorted(sid for sid, owner in owners.items() if owner == worker.worker_id)


def session_of(fleet: Fleet, worker: WorkerProcess) -> dict:
    """The worker's live session item (the newest), read consistently."""
    items = [
        item
        for item in fleet.dynamodb.scan(TableName=fleet.lease_table, ConsistentRead=True)["Items"]
        if item[model.PK]["S"].startswith(f"{model.SESSION_PREFIX}{worker.worker_id}#")
    ]
    return max(items, key=lambda item: int(item[model.SESSION_VERSION]["N"]))


async def test_every_worker_session_records_its_own_task(fleet: Fleet):
    workers = start(fleet, 2)
    await eventually(
        lambda: all(w.events("session_opened") for w in workers), timeout=30, what="sessions"
    )
    arns = {w.worker_id: session_of(fleet, w)[model.SESSION_TASK_ARN]["S"] for w in workers}
    assert arns == {w.worker_id: fleet.ecs.task_of(w).arn for w in workers}
    assert len(set(arns.values())) == 2


async def test_kill_9_moves_every_stream_before_the_lease_could(fleet: Fleet):
    workers = start(fleet, 3)
    ids = streams(15)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=30, what="all streams live")
    victim, owned = busiest(fleet, workers)
    survivors = {w.worker_id for w in workers if w is not victim}
    session = session_of(fleet, victim)
    # The earliest a taker could act on the lease alone (expiry + skew, on this host's clock).
    lease_possible_ms = int(session[model.EXPIRES_AT_MS]["N"]) + 500

    killed = time.monotonic()
    victim.signal(signal.SIGKILL)
    await eventually(
        lambda: fleet.all_live(ids, among=survivors),
        timeout=4 * LEASE_SECONDS,
        what="the victim's streams live elsewhere",
        every=0.02,
    )
    recovered_ms = time.time_ns() // 1_000_000
    recovery = time.monotonic() - killed

    assert recovered_ms < lease_possible_ms, (
        f"recovered in {recovery:.2f} s: no sooner than the lease would have"
    )
    delivery = fleet.ecs.wait_for_delivery(victim.worker_id, timeout=5)
    assert delivery.result["decision"] == "acted", delivery
    assert delivery.result["notified"] == len(owned)
    assert delivery.event["detail"]["containers"][0]["exitCode"] == 128 + signal.SIGKILL
    ended = session_of(fleet, victim)
    assert ended[model.SESSION_STATE]["S"] == model.SessionState.ENDED.value
    assert ended[model.SESSION_ENDED_BY]["S"].startswith(model.ENDED_BY_TASK_STOPPED)
    gained = [
        e
        for w in workers
        if w is not victim
        for e in w.events("lease_gained")
        if model.connection_id_of(e["pk"]) in owned
    ]
    assert sorted(model.connection_id_of(e["pk"]) for e in gained) == owned
    assert {e["via"] for e in gained} <= {"intake", "reconcile"}
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [20] for sid in ids), timeout=15, what="progress"
    )
    fleet.assert_single_client_ever()
    fleet.assert_log_exact(ids)


async def test_a_forged_event_for_a_frozen_worker_costs_availability_never_double_ownership(
    fleet: Fleet,
):
    workers = start(fleet, 2)
    ids = streams(10)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=30, what="all streams live")
    frozen, owned = busiest(fleet, workers)
    [other] = [w for w in workers if w is not frozen]
    assert owned

    frozen.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    # A wrong event: ECS never sends STOPPED for a task that still runs; forge it anyway.
    task = fleet.ecs.task_of(frozen)
    delivery = await asyncio.to_thread(
        fleet.ecs.emit, fleet.ecs.stopped_event(task), worker_id=frozen.worker_id
    )
    assert delivery.matched and delivery.result["decision"] == "acted", delivery
    assert session_of(fleet, frozen)[model.SESSION_STATE]["S"] == model.SessionState.ENDED.value
    await eventually(
        lambda: fleet.all_live(ids, among={other.worker_id}),
        timeout=LEASE_SECONDS,
        what="the frozen worker's streams live on the other",
        every=0.02,
    )
    # Woken well before its holder's deadline: what ends it is the fence, not the lease.
    frozen.signal(signal.SIGCONT)
    assert time.monotonic() - frozen_at < LEASE_SECONDS - 2

    await eventually(
        lambda: frozen.events("session_lost"),
        timeout=3 * float(TIMING["HEARTBEAT_EVERY"]),
        what="its renewal finding the session ended",
    )
    assert not frozen.events("deadline_passed")
    # It closes every connection it held (written nothing: someone else owns them).
    await eventually(
        lambda: (
            {model.connection_id_of(e["pk"]) for e in frozen.events("lease_lost")} >= set(owned)
        ),
        timeout=5,
        what="its connections closed as lost",
    )
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [30] for sid in ids), timeout=15, what="progress"
    )
    assert all(owner == other.worker_id for owner in fleet.owners().values())
    assert frozen.alive()  # it lost its streams, not its life: it takes work again later
    fleet.assert_single_client_ever()
    fleet.assert_log_exact(ids)


async def test_a_sigterm_handoff_then_stopped_changes_nothing(fleet: Fleet):
    workers = start(fleet, 2)
    ids = streams(6)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=30, what="all streams live")
    leaving, _ = busiest(fleet, workers)
    [staying] = [w for w in workers if w is not leaving]

    leaving.signal(signal.SIGTERM)  # DEACTIVATING/STOPPING in ECS: no event is acted on yet
    assert await asyncio.to_thread(leaving.process.wait, 20) == 0

    # Once it has exited, ECS reports STOPPED: the session was closed by its holder already.
    delivery = fleet.ecs.wait_for_delivery(leaving.worker_id, timeout=5)
    assert delivery.result["decision"] == "unchanged", delivery
    assert [s["outcome"] for s in delivery.result["sessions"]] == ["already_ended"]
    await eventually(
        lambda: fleet.all_live(ids, among={staying.worker_id}), timeout=10, what="handed over"
    )
    fleet.assert_single_client_ever()

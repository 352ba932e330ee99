"""The worker fleet end to end: real worker processes, real signals, moto's server, the fake
upstream. Lease 2 s, heartbeat 0.5 s. Each test ends by checking what a user cares about most:
the upstream never saw two clients on one stream, and no seq is missing or stored twice.

Bounds here are correctness bounds (generous multiples of the lease); the speed figures are
measured by ``make bench``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from urllib.request import urlopen

import pytest

from streamfleet import model
from streamfleet_dev.local.fleet import LEASE_SECONDS, REPO, Fleet, WorkerProcess, eventually
from streamfleet_dev.upstream.fake import FakeUpstream

pytestmark = pytest.mark.slow

RECOVERY_BOUND = 15 * LEASE_SECONDS  # correctness bound: a lease, then a claim, with 10x margin


@pytest.fixture
async def fleet(moto, servers, tmp_path, monkeypatch) -> AsyncIterator[Fleet]:
    # DynamoDB on dynalite: moto's server does not serialise concurrent conditional writes
    # (see the conformance suite), and the fleet's safety rests on them. SQS stays on moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    async with FakeUpstream(rate=20, keepalive_seconds=0.3) as upstream:
        fleet = Fleet(endpoint=servers["dynalite"].endpoint, upstream=upstream, tmp=tmp_path)
        try:
            yield fleet
        finally:
            fleet.close()


def read_url(url: str) -> bytes:
    with urlopen(url, timeout=2) as response:
        return response.read()


def streams(n: int, prefix: str = "s") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def busiest(fleet: Fleet, workers: list[WorkerProcess]) -> tuple[WorkerProcess, list[str]]:
    """The worker owning most streams (whoever polled SQS first got the burst), and its streams."""
    owners = fleet.owners()
    worker = max(workers, key=lambda w: sum(o == w.worker_id for o in owners.values()))
    return worker, [sid for sid, owner in owners.items() if owner == worker.worker_id]


async def test_a_burst_of_starts_is_claimed_in_batches_and_all_connected(fleet: Fleet):
    workers = [fleet.start_worker(HEALTH_PORT="0") for _ in range(2)]  # each binds a free port
    ids = streams(40)

    await fleet.start_streams(*ids)

    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all 40 streams live")
    gained = [e for w in workers for e in w.events("lease_gained")]
    assert sorted(model.connection_id_of(e["pk"]) for e in gained) == ids
    assert {e["via"] for e in gained} <= {"intake", "reconcile"}
    fleet.assert_single_client_ever()

    # What the container health check and the scaling policy see. A worker whose session opened
    # after the other took the whole burst may not serve its endpoint yet: polled, not read once.
    def health() -> list[dict] | None:
        listening = [w.events("health_listening") for w in workers]
        if not all(listening):
            return None
        try:
            return [
                json.loads(read_url(f"http://127.0.0.1:{events[0]['port']}/health"))
                for events in listening
            ]
        except OSError:
            return None

    reports = await eventually(
        lambda: asyncio.to_thread(health), timeout=30, what="both health endpoints answering"
    )
    assert sum(h["connections"] for h in reports) == 40 and all(h["session_live"] for h in reports)

    def metrics_add_up() -> bool:
        latest = [w.metrics()[-1:] for w in workers]
        return all(latest) and sum(m[0][model.METRIC_ACTIVE_CONNECTIONS] for m in latest) == 40

    await eventually(metrics_add_up, timeout=5, what="ActiveConnections adding up to 40")


async def test_kill_9_moves_every_stream_of_the_dead_worker_to_the_others(fleet: Fleet):
    workers = [fleet.start_worker() for _ in range(3)]
    ids = streams(15)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")
    victim, owned_by_victim = busiest(fleet, workers)
    others = [w for w in workers if w is not victim]

    victim.signal(signal.SIGKILL)

    survivors = {w.worker_id for w in others}
    await eventually(
        lambda: fleet.all_live(ids, among=survivors),
        timeout=RECOVERY_BOUND,
        what="the victim's streams live elsewhere",
    )
    taken = [e for w in others for e in w.events("lease_taken_over")]
    assert {model.connection_id_of(e["pk"]) for e in taken} == set(owned_by_victim)
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [10] for sid in ids), timeout=10, what="progress"
    )
    fleet.assert_single_client_ever()
    fleet.assert_log_exact(ids)


async def test_sigterm_hands_every_connection_over_and_exits(fleet: Fleet):
    workers = [fleet.start_worker(), fleet.start_worker()]
    ids = streams(12)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")
    leaving, mine = busiest(fleet, workers)
    [staying] = [w for w in workers if w is not leaving]

    leaving.signal(signal.SIGTERM)

    assert await asyncio.to_thread(leaving.process.wait, 30) == 0
    [stopped] = leaving.events("worker_stopped")
    assert stopped["handed_over"] == len(mine)
    assert len(leaving.events("lease_handed_over")) == len(mine)
    await eventually(
        lambda: fleet.all_live(ids, among={staying.worker_id}),
        timeout=30,
        what="handed-over streams live on the other worker",
    )
    # Released and claimed, not taken over once the leaving worker's lease had expired.
    taken_over = {e["pk"] for e in staying.events("lease_taken_over")}
    assert not taken_over & {model.connection_pk(s) for s in mine}, taken_over
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [10] for sid in ids), timeout=10, what="progress"
    )
    fleet.assert_single_client_ever()
    fleet.assert_log_exact(ids)


async def test_a_worker_paused_past_its_lease_writes_and_holds_nothing_after(fleet: Fleet):
    workers = [fleet.start_worker(), fleet.start_worker()]
    ids = streams(10)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")
    paused, _ = busiest(fleet, workers)
    [other] = [w for w in workers if w is not paused]

    paused.signal(signal.SIGSTOP)
    await eventually(
        lambda: fleet.all_live(ids, among={other.worker_id}),
        timeout=RECOVERY_BOUND,
        what="streams taken over from the paused worker",
    )
    resumed_ms = time.time_ns() // 1_000_000
    paused.signal(signal.SIGCONT)

    await eventually(
        lambda: paused.events("deadline_passed") or paused.events("session_reopened"),
        timeout=10,
        what="the paused worker noticing its deadline passed",
    )
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [20] for sid in ids), timeout=10, what="progress"
    )
    # Nothing it received after waking up was stored (a batch already handed to the network
    # before the freeze may still land: same (pk, seq), same data, so it changes nothing).
    assert fleet.stored_by(paused.worker_id, received_after_ms=resumed_ms) == 0
    assert all(owner == other.worker_id for owner in fleet.owners().values())
    fleet.assert_single_client_ever()
    fleet.assert_log_exact(ids)


async def test_stop_closes_the_stream_found_by_the_stopped_query(fleet: Fleet):
    worker = fleet.start_worker()
    ids = streams(5)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")

    await fleet.stop_stream(ids[0])

    await eventually(
        lambda: fleet.upstream.stats()["connected"][ids[0]] == 0,
        timeout=20,
        what="the stopped stream closed",
    )
    row = await eventually(
        lambda: model.LEASE_OWNER not in fleet.rows()[ids[0]] and fleet.rows()[ids[0]],
        timeout=20,
        what="the stopped stream released",
    )
    assert row[model.DESIRED_STATE] == "STOPPED"
    assert fleet.all_live(ids[1:])
    worker.signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.process.wait, 30) == 0
    [stopped] = worker.events("worker_stopped")
    # Found by the one stopped-connections query per interval, never by reading each row: the
    # only single reads are the ones a contested claim makes (dynalite returns no ALL_OLD).
    gained = len(worker.events("lease_gained"))
    assert stopped["dynamodb_requests"].get("get_item", 0) <= gained
    assert stopped["dynamodb_requests"]["query"] >= 1
    first_release = worker.events("lease_released")[0]
    assert (first_release["pk"], first_release["reason"]) == (
        model.connection_pk(ids[0]),
        "stopped",
    )


async def test_an_upstream_drop_reconnects_without_losing_the_lease(fleet: Fleet):
    worker = fleet.start_worker()
    ids = streams(3)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")
    versions = {sid: row[model.LEASE_VERSION] for sid, row in fleet.rows().items()}

    await fleet.upstream.drop_clients()

    await eventually(
        lambda: (
            all(fleet.upstream.stats()["connections"][sid] >= 2 for sid in ids)
            and fleet.all_live(ids)
        ),
        timeout=5,
        what="reconnected",
    )
    await eventually(
        lambda: all(fleet.stored_seqs(sid)[-1:] > [15] for sid in ids), timeout=10, what="progress"
    )
    assert {sid: row[model.LEASE_VERSION] for sid, row in fleet.rows().items()} == versions
    assert worker.events("upstream_dropped")
    fleet.assert_log_exact(ids)


async def test_a_start_for_a_url_off_the_allow_list_is_refused_and_marked(fleet: Fleet):
    fleet.start_worker()
    result = await fleet.writer.start("evil", "ws://169.254.169.254/latest/meta-data")
    fleet.sqs.send_message(
        QueueUrl=fleet.queue_url, MessageBody=model.notification_body(result.item["pk"])
    )

    # Marked, then released: two writes, so the row is polled until both are in.
    row = await eventually(
        lambda: (
            (row := fleet.rows()["evil"]).get(model.REFUSED_REASON)
            and model.LEASE_OWNER not in row
            and row
        ),
        timeout=20,
        what="the refused row marked and released",
    )
    assert row[model.DESIRED_STATE] == "STOPPED"
    assert "not allow-listed" in row[model.REFUSED_REASON]


async def test_an_overloaded_worker_sheds_its_surplus_without_churn(fleet: Fleet):
    rebalance = {
        "REBALANCE_EVERY": "1",
        "REBALANCE_HOLD_SECONDS": "2",
        "REBALANCE_MAX_PER_INTERVAL": "4",
    }
    crowded = fleet.start_worker("crowded", **rebalance)
    ids = streams(20)
    await fleet.start_streams(*ids)
    await eventually(
        lambda: fleet.all_live(ids, among={"crowded"}), timeout=15, what="all on one worker"
    )

    fleet.start_worker("newcomer", **rebalance)

    def balanced() -> bool:
        held = list(fleet.owners().values())
        handoffs = crowded.events("lease_handed_over")
        quiet = not handoffs or time.time() - handoffs[-1]["ts"] > 2
        return quiet and fleet.all_live(ids) and 8 <= held.count("newcomer") <= 12

    await eventually(balanced, timeout=20, what="the load shared between the two workers")
    shed = crowded.events("lease_handed_over")
    assert shed and {e["reason"] for e in shed} == {"handoff"}
    # No churn: once balanced, nothing moves any more.
    settled = fleet.owners()
    moves = len(crowded.events("lease_handed_over"))
    await asyncio.sleep(3)  # an observation window, not synchronisation
    assert fleet.owners() == settled
    assert len(crowded.events("lease_handed_over")) == moves
    fleet.assert_single_client_ever()


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's tool, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "streamfleet_ops.cli", *args],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO)]),
            "TABLE_NAME": fleet.lease_table,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_an_operator_drains_a_worker_and_lists_the_fleet(fleet: Fleet):
    workers = [fleet.start_worker(), fleet.start_worker()]
    ids = streams(8)
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="all streams live")
    drained, _ = busiest(fleet, workers)
    [other] = [w for w in workers if w is not drained]

    result = await asyncio.to_thread(cli, fleet, "drain", drained.worker_id, "--json")

    assert result.returncode == 0, result.stderr
    await eventually(
        lambda: fleet.all_live(ids, among={other.worker_id}),
        timeout=4 * LEASE_SECONDS,
        what="every stream moved off the drained worker",
    )
    assert drained.alive() and drained.events("draining")
    listed = json.loads((await asyncio.to_thread(cli, fleet, "connections", "--json")).stdout)
    assert {row["connection_id"]: row["owner"] for row in listed} == dict.fromkeys(
        ids, other.worker_id
    )
    sessions = json.loads((await asyncio.to_thread(cli, fleet, "workers", "--json")).stdout)
    loads = {row["worker"]: row["load"] for row in sessions if row["state"] == "LIVE"}
    assert set(loads) == {drained.worker_id, other.worker_id}
    bad = await asyncio.to_thread(cli, fleet, "drain", "no-such-worker")
    assert bad.returncode == 1 and "no live session" in bad.stderr


async def test_a_row_owned_but_not_run_is_given_back_by_the_audit(fleet: Fleet):
    """A release that failed while the session stayed live leaves a row owned by a worker that
    does not run it; the worker's periodic audit of its own rows must give it back."""
    worker = fleet.start_worker()
    [session] = await eventually(
        lambda: worker.events("session_opened"), timeout=15, what="the worker's session"
    )
    await fleet.start_streams("stuck")
    await eventually(lambda: fleet.all_live(["stuck"]), timeout=15, what="stuck live")
    # Make the table say the worker owns a second row it has never heard of.
    await fleet.writer.start("ghost", fleet.upstream.url_for("ghost"))
    fleet.dynamodb.update_item(
        TableName=fleet.lease_table,
        Key={model.PK: {"S": model.connection_pk("ghost")}},
        UpdateExpression="SET #o = :o, #s = :s, #v = :v REMOVE #a",
        ExpressionAttributeNames={
            "#o": model.LEASE_OWNER,
            "#s": model.LEASE_SESSION,
            "#v": model.LEASE_VERSION,
            "#a": model.AWAITING_OWNER,
        },
        ExpressionAttributeValues={
            ":o": {"S": worker.worker_id},
            ":s": {"N": str(session["session_version"])},
            ":v": {"N": "1"},
        },
    )

    await eventually(
        lambda: fleet.all_live(["stuck", "ghost"]), timeout=20, what="the ghost row run"
    )
    audited = [e for e in worker.events("lease_released") if e.get("reason") == "audit"]
    assert [e["pk"] for e in audited] == [model.connection_pk("ghost")]
    fleet.assert_single_client_ever()

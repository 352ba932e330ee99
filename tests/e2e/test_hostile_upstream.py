"""A broken or hostile upstream hurts only its own stream: real worker processes against the
fake upstream's hostile modes (poison frames, gaps, a message over the limit, a ping flood from
an upstream that never reads, instant closes) beside calm streams, on dynalite and moto.

Bounds are correctness bounds with wide margins; the frames themselves are judged by the unit
tests (``tests/unit/worker``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from streamfleet import model
from streamfleet_dev.local.fleet import Fleet, eventually
from streamfleet_dev.upstream.fake import FakeUpstream

pytestmark = pytest.mark.slow

HOSTILE = {
    "poisoned": frozenset({"poison", "gap"}),
    "flooding": frozenset({"pingflood"}),
    "oversized": frozenset({"oversize"}),
    "closing": frozenset({"close"}),
}
CALM = [f"calm{n}" for n in range(4)]
# A stream that fails on every dial backs off to this cap; before the fix each handshake reset
# the backoff and such a stream was redialled about 10 times a second.
RECONNECT_CAP_SECONDS = 5


@pytest.fixture
async def fleet(moto, servers, tmp_path, monkeypatch) -> AsyncIterator[Fleet]:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    # Its own keepalive at the default 20 s: the ping flood is cut off by the worker, not by
    # the upstream giving up on the pongs it does not read.
    async with FakeUpstream(rate=20) as upstream:
        fleet = Fleet(
            endpoint=servers["dynalite"].endpoint,
            upstream=upstream,
            tmp=tmp_path,
            hostile=dict(HOSTILE),
            extra_env={"RECONNECT_CAP_SECONDS": str(RECONNECT_CAP_SECONDS)},
        )
        try:
            yield fleet
        finally:
            fleet.close()


async def test_a_hostile_upstream_hurts_only_its_own_stream(fleet: Fleet):
    workers = [fleet.start_worker() for _ in range(2)]
    streams = CALM + sorted(HOSTILE)
    await fleet.start_streams(*streams)

    def stored(stream: str) -> int:
        return len(fleet.stored_seqs(stream))

    def dropped(stream: str, error: str | None = None) -> list[dict]:
        return [
            event
            for worker in workers
            for event in worker.events("upstream_dropped")
            if event["pk"] == model.connection_pk(stream) and error in (None, event["error"])
        ]

    # The calm streams and the poisoned one keep flowing; the flooded one is cut off when its
    # unsent pongs pass the cap, and keeps flowing across redials; the oversized one is parked
    # before seq 50, the one that cannot be taken.
    await eventually(
        lambda: all(stored(s) >= 100 for s in [*CALM, "poisoned"]),
        timeout=60,
        what="100 messages on every calm stream and on the poisoned one",
    )
    await eventually(
        lambda: dropped("flooding", "not reading") and stored("flooding") >= 60,
        timeout=60,
        what="the flooding stream cut off for not reading, and still flowing",
    )
    await eventually(
        lambda: max(fleet.stored_seqs("oversized"), default=0) == 49,
        timeout=60,
        what="the oversized stream stored up to the message it cannot take",
    )

    # No stream lost its lease or its connection to another's upstream.
    for name in ("connection_failed", "lease_lost", "lease_handed_over", "lease_taken_over"):
        assert not [e for w in workers for e in w.events(name)], name
    assert not [s for s in CALM if dropped(s)], "a calm stream lost its upstream connection"
    refused = [e for w in workers for e in w.events("upstream_frame_refused")]
    assert {model.connection_id_of(e["pk"]) for e in refused} == {"poisoned", "oversized"}
    # Logged at most once per 10 s per stream, each counted in full.
    assert len(refused) <= 2 * len(workers) * 10, len(refused)
    refused_total = sum(m[model.METRIC_FRAMES_REFUSED] for w in workers for m in w.metrics())
    assert refused_total > len(refused)

    # Streams that fail on every dial back off: a few dials each, not one every 100 ms.
    connections = fleet.upstream.stats()["connections"]
    assert connections["oversized"] <= 40 and connections["closing"] <= 40, connections

    for stream in streams:
        await fleet.stop_stream(stream)
    await eventually(
        lambda: all(
            model.LEASE_OWNER not in row and model.UNSEALED not in row
            for row in fleet.rows().values()
        ),
        timeout=60,
        what="every stream stopped, released and sealed",
    )
    # Exactly what a correct worker stores: every readable frame once, gaps kept (sealing
    # deleted what lay past the first gap), no poison, nothing of the closing stream.
    assert fleet.log_problems(streams, final=True) == []
    assert stored("closing") == 0
    # One client per stream at a time. The flooding stream is left out: the socket the worker
    # aborted stays open at the upstream, which is not reading, until its next ping fails.
    stats = fleet.upstream.stats()
    assert {s: n for s, n in stats["overlaps"].items() if s != "flooding" and n} == {}


async def test_a_url_that_never_works_is_held_off_across_the_fleet(fleet: Fleet):
    """A redirect to another origin can never be followed (the worker dials the checked address
    only): each owner failed at once and offered the stream back, and the fleet claimed it
    again at once, round and round. Now every failure holds the stream off in its row, for
    every worker, twice as long each time, and says why."""
    fleet.hostile["redirected"] = frozenset({"redirect"})
    workers = [fleet.start_worker() for _ in range(2)]
    await fleet.start_streams("redirected", *CALM)

    row = await eventually(
        lambda: (row := fleet.rows()["redirected"]).get(model.DIAL_FAILURES, 0) >= 4 and row,
        timeout=120,  # holds of at least 0.5 + 1 + 2 s before the fourth failure
        what="four consecutive failures of the redirected stream",
    )
    assert "cross-origin redirect" in row[model.LAST_FAILURE]
    assert row[model.DESIRED_STATE] == "STARTED"  # kept: the upstream may come back
    # One dial per claim, and no claim before the shortest hold its failures earned had
    # passed (the k-th failure holds it at least half of 2^(k-1) base holds).
    redirected = fleet.upstream.stats()["redirected"]["redirected"]
    assert redirected <= row[model.LEASE_VERSION] <= row[model.DIAL_FAILURES] + 1, (
        redirected,
        row,
    )
    pk = model.connection_pk("redirected")
    claimed_at = sorted(e["ts"] for w in workers for e in w.events("lease_gained") if e["pk"] == pk)
    shortest = [0.5 * model.HOLD_OFF_BASE_MS / 1000 * 2**k for k in range(len(claimed_at) - 1)]
    waited = [later - earlier for earlier, later in itertools.pairwise(claimed_at)]
    assert all(w >= s for w, s in zip(waited, shortest, strict=True)), (waited, shortest)
    held = [e for w in workers for e in w.events("stream_held_off")]
    assert len(held) >= 4 and {e["pk"] for e in held} == {model.connection_pk("redirected")}
    await eventually(  # the count goes out with the next metrics document
        lambda: sum(m[model.METRIC_STREAMS_HELD_OFF] for w in workers for m in w.metrics()) >= 4,
        timeout=30,
        what="the hold-offs counted in the metric",
    )
    # The rest of the fleet never noticed.
    assert fleet.all_live(CALM)

    await fleet.stop_stream("redirected")
    await eventually(
        lambda: (
            not {model.LEASE_OWNER, model.UNSEALED, model.AWAITING_OWNER}
            & set(fleet.rows()["redirected"])
        ),
        timeout=120,  # a hold of up to 16 s first
        what="the stopped stream released and closed",
    )

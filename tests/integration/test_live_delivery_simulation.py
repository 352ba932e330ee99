"""Live delivery on a virtual clock (``streamfleet_dev.dsim.live``): the deployed
handlers, fan-out and stream cursors against an in-process DynamoDB and API Gateway, with
seeded latencies, lost answers, killed fan-out invocations, dropped connections, expiring
tokens, readers changes, regional failovers (a second Region fed by out-of-order
replication), heartbeats, getState and client restarts; every client's application checked
against the stored log; a seed replays byte for byte.

``make sim`` runs 10,000 fresh seeds; ``SIM_SEED=<n> SIM_SYSTEM=live make sim`` prints one
trace."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from streamfleet.wsapi import delivery, fanout
from streamfleet.wsapi.fanout import Fanout
from streamfleet.wsapi.handlers import subscribe
from streamfleet.wsapi.handlers.subscribe import Subscriptions
from streamfleet_client.streams import StreamCursor
from streamfleet_dev.dsim.live import Schedule, heartbeat, run_schedule
from streamfleet_dev.dsim.live.aws import Gateway
from streamfleet_dev.dsim.live.client import Client
from streamfleet_dev.dsim.runner import run_many

# A fixed list, so the gate is the same on every run; make sim draws fresh ones.
SEEDS = range(1, 201)
# Seeds of that list that catch each defect below (found by running the list with the defect
# in place; each catches it every time).
CATCHES_POSTING_TO_EVERYONE = (6, 8, 11)
CATCHES_MOVING_BACK = (5, 10, 19)
CATCHES_POSITIONS_PER_REGION = (2, 4, 13)  # schedules with a regional failover
CATCHES_IGNORING_MISSED_PONGS = (75, 88, 94)  # schedules whose primary Region is cut off
CATCHES_IGNORING_SERVER_STATE = (5, 10, 13)  # schedules with a client restart
CATCHES_NO_READERS_CHECK_AFTER_REPLAY = (17, 18, 38)
CATCHES_NO_TOKEN_CHECK_AFTER_REPLAY = (1, 13, 37)
CATCHES_A_CUT_PER_PATH = (10, 83, 89)
CATCHES_EVERY_HOLE_SKIPPED = (6, 111, 128)
CATCHES_NO_EPOCH_ON_THE_WIRE = (6, 11, 13)
CATCHES_AN_UNBOUNDED_REPLAY = (80,)  # a replay of over 1 MiB of large messages


def test_every_fixed_schedule_delivers_the_stored_log_exactly_once_in_order() -> None:
    outcomes = list(run_many("live", SEEDS))
    failed = [f"SIM_SEED={o.schedule.seed}: {o.problems}" for o in outcomes if not o.ok]
    assert failed == []
    # The schedules did what they are for: messages delivered through faults, epochs begun,
    # messages in parts, readers changed, connections dropped, tokens expired, messages deleted
    # by TTL and the clients told what they will never receive.
    assert sum(o.delivered for o in outcomes) > 1_000
    assert sum(o.faults for o in outcomes) > 100
    traces = "".join(o.trace for o in outcomes)
    for sign in (
        "answer lost",
        "fan-out batch of",
        "exclude team:",
        "include again",
        "dropped by",
        "token expired",
        "closed by fanout",
        "refused",
        "TTL deleted",
        "skipped",
        # Regional failovers: the primary's API down, or the whole Region cut off (its
        # clients' sockets dead, its writes held back from the replica); the name moving to
        # the secondary and back; clients served by the secondary's handlers and fan-out.
        "the primary's api fails",
        "the primary's region fails",
        "cut off with its Region",
        "closed by the tripped canary",
        "the failover name answers with the secondary",
        "the primary recovers",
        "the failover name answers with the primary again",
        "us-west-2 fan-out batch",
        # Heartbeats and getState: a client on a cut-off Region gives its connection up after
        # its missed pongs; a restarted client takes its subscriptions from getState, in
        # either Region (the state table replicates both ways).
        "heartbeats unanswered",
        "restarting",
        "(server-state)",
        " state on d",
    ):
        assert sign in traces, sign
    assert " connected d" in traces  # a client connected to the secondary
    schedules = [o.schedule for o in outcomes]
    assert any(s.large_share for s in schedules) and any(s.restart_share for s in schedules)
    assert any(s.retention_s for s in schedules)
    assert 20 <= sum(s.failover is not None for s in schedules) <= 60


def test_a_seed_replays_the_same_schedule_and_outcome_byte_for_byte() -> None:
    first, again = (run_schedule(Schedule.generate(5)) for _ in range(2))
    assert first.trace == again.trace and first.problems == again.problems
    assert " subscribe " in first.trace and " connected " in first.trace
    assert run_schedule(Schedule.generate(6)).trace != first.trace

    def printed(hash_seed: str, seed: int = 5) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "SIM_SEED": str(seed)}
        done = subprocess.run(
            [sys.executable, "-m", "streamfleet_dev.dsim", "--system", "live"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    # Another process, another string hashing: the same bytes.
    assert printed("1") == printed("2")
    assert first.trace in printed("3")
    # A schedule with a regional failover (two Regions, replication) too.
    assert Schedule.generate(2).failover is not None
    assert printed("1", 2) == printed("2", 2)


def test_a_fanout_that_posts_to_every_subscriber_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail: a fan-out that no longer checks readers and token expiry at
    delivery posts what was stored after a readers change or a token's end."""
    original = Fanout.audience

    def everyone(self: Fanout, stream: str) -> tuple[list[str], list[str]]:
        allowed, revoked = original(self, stream)
        return [*allowed, *revoked], []

    monkeypatch.setattr(Fanout, "audience", everyone)
    for seed in CATCHES_POSTING_TO_EVERYONE:
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("was posted to it" in problem for problem in problems), (seed, problems)


def test_a_cursor_that_moves_back_to_a_replys_after_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail on exactly once: a cursor that takes a subscribe reply's ``after``
    although it delivered past it (a reply to a subscribe sent before live messages arrived)
    delivers those messages again."""
    original = StreamCursor.on_subscribed

    def moving_back(self: StreamCursor, reply: dict[str, Any], now: float) -> Any:
        after = reply.get("after")
        same_epoch = int(reply.get("afterEpoch") or 0) == self.epoch
        if isinstance(after, int) and self.position is not None and same_epoch:
            self.position = min(self.position, after)
        return original(self, reply, now)

    monkeypatch.setattr(StreamCursor, "on_subscribed", moving_back)
    for seed in CATCHES_MOVING_BACK:
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("where the log has" in problem for problem in problems), (seed, problems)


def test_a_schedule_leaves_nothing_of_itself_behind() -> None:
    """A task still waiting at the end kept its frames, and through them the whole run:
    make sim's ten thousand schedules grew a process to 12 GB."""
    import gc

    from streamfleet_dev.dsim.live import World

    for seed in (1, 2):
        run_schedule(Schedule.generate(seed))
    gc.collect()
    assert [o for o in gc.get_objects() if isinstance(o, World)] == []


def test_a_client_that_starts_afresh_in_another_region_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail across a regional failover: a client that keeps its positions per
    Region (taking the secondary's log for another log) subscribes there from the newest, and
    its application receives again what the primary delivered."""
    original = Gateway.connect
    last_region: dict[str, object] = {}

    def afresh_in_another_region(self: Gateway, client: Any, token_expires_at: int) -> Any:
        connection = original(self, client, token_expires_at)
        if connection is None:
            return None
        if last_region.get(client.plan.user, self.region) is not self.region:
            for cursor in client.subscriptions.values():
                cursor.position, cursor.epoch = None, 0
                cursor.buffer.clear()
        last_region[client.plan.user] = self.region
        return connection

    monkeypatch.setattr(Gateway, "connect", afresh_in_another_region)
    for seed in CATCHES_POSITIONS_PER_REGION:
        last_region.clear()
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("before what was delivered" in problem for problem in problems), (
            seed,
            problems,
        )


def test_a_client_that_ignores_missed_pongs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker can fail on the heartbeat: a client that keeps a connection of a cut-off
    Region (its socket looks open, nothing answers) past its missed pongs."""
    original = heartbeat.HeartbeatWatch.tick

    def deaf(self: heartbeat.HeartbeatWatch, now: float) -> str | None:
        action = original(self, now)
        return None if action == "give up" else action

    monkeypatch.setattr(heartbeat.HeartbeatWatch, "tick", deaf)
    for seed in CATCHES_IGNORING_MISSED_PONGS:
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("heartbeats unanswered)" in problem for problem in problems), (seed, problems)


def test_a_restarted_client_that_ignores_get_states_subscriptions_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail on getState: a client that does not follow the server's list of
    the user's subscriptions comes back from a restart without them."""
    monkeypatch.setattr(Client, "_on_state", lambda self, connection, state: None)
    for seed in CATCHES_IGNORING_SERVER_STATE:
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("not subscribed again from getState" in problem for problem in problems), (
            seed,
            problems,
        )


def test_a_readers_change_raced_with_the_start_lands_after_it() -> None:
    """A fresh seed of make sim: a subscribe sent before the streams' START was answered, and
    the adversary's readers change raced with it. The change must wait for the START, or the
    START lands over it and the checker sees an excluded reader served."""
    outcome = run_schedule(Schedule.generate(311491429))
    assert outcome.problems == []
    assert "readers of s1 exclude team:red" in outcome.trace


def _missed(seeds: tuple[int, ...], *signs: str) -> list[tuple[int, list[str]]]:
    """The seeds of ``seeds`` whose run reports no problem containing one of ``signs``, with
    the problems it reports."""
    missed = []
    for seed in seeds:
        problems = run_schedule(Schedule.generate(seed)).problems
        if not any(sign in problem for problem in problems for sign in signs):
            missed.append((seed, problems))
    return missed


def test_a_subscribe_that_serves_its_replay_without_reading_the_readers_again_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail on a replay read across a readers change: what was stored after
    the START that excluded the reader reaches them."""
    monkeypatch.setattr(Subscriptions, "_check_readers_after_replay", lambda *args: None)
    assert _missed(CATCHES_NO_READERS_CHECK_AFTER_REPLAY, "was posted to it") == []


def test_a_subscribe_that_serves_its_replay_past_the_tokens_end_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail on a replay read across a token's end: what was stored after it
    reaches the connection."""
    monkeypatch.setattr(Subscriptions, "_check_token_after_replay", lambda *args: None)
    sign = "stored after its token expired was posted"
    assert _missed(CATCHES_NO_TOKEN_CHECK_AFTER_REPLAY, sign) == []


def test_parts_cut_for_their_own_envelope_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker can fail on large messages: a replay and the fan-out that each cut a
    message's parts for their own envelope (their source, their Region's name) cut it
    differently, and a client that joins parts of both paths gets other bytes."""
    original = delivery.pack_frames

    def cut_for_its_own_envelope(stream: str, messages: Any, **kwargs: Any) -> Any:
        widest = delivery.SOURCES, delivery.REGION_ROOM
        delivery.SOURCES, delivery.REGION_ROOM = (kwargs["source"],), 0
        try:
            return original(stream, messages, **kwargs)
        finally:
            delivery.SOURCES, delivery.REGION_ROOM = widest

    for where in (subscribe, fanout):
        monkeypatch.setattr(where, "pack_frames", cut_for_its_own_envelope)
    signs = ("other bytes than stored", "never delivered")
    assert _missed(CATCHES_A_CUT_PER_PATH, *signs) == []


def test_a_hole_skipped_while_it_may_still_be_filled_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail on holes: a subscribe that skips every hole after its ``after``,
    though a batch still landing fills it, tells the client to pass over stored messages."""
    monkeypatch.setattr(subscribe, "hole_is_unfillable", lambda after, replay, now_ms: bool(replay))
    monkeypatch.setattr(
        delivery.StoredMessage, "follows_unfillable_hole", lambda self, after, now_ms: True
    )
    assert _missed(CATCHES_EVERY_HOLE_SKIPPED, "though the log holds") == []


def test_entries_without_their_epoch_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker can fail on epochs: entries that carry their seq alone (a client takes
    them for epoch 0) put a restarted stream's messages in the wrong place."""
    original = delivery._entry

    def without_epoch(message: Any, data: str, part: Any = None) -> dict[str, Any]:
        entry = original(message, data, part)
        del entry["epoch"]
        return entry

    monkeypatch.setattr(delivery, "_entry", without_epoch)
    signs = ("where the log has", "epoch change", "never delivered", "other bytes than stored")
    assert _missed(CATCHES_NO_EPOCH_ON_THE_WIRE, *signs) == []


def test_a_replay_unbounded_in_bytes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker can fail on the work bound: a subscribe whose replay is bounded in
    messages only posts several megabytes in one invocation."""
    monkeypatch.setattr(subscribe, "REPLAY_MAX_BYTES", 1 << 60)
    assert _missed(CATCHES_AN_UNBOUNDED_REPLAY, "bytes of message data (bound") == []

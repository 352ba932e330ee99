"""The live simulation's client session: heartbeats decided as ``ReconnectingClient`` decides
them (a heartbeat after an interval without a pong; a connection that answers nothing is given
up after its missed pongs, within the interval plus the timeouts), and getState sent again until
answered, then given up."""

from __future__ import annotations

import itertools
import random

from streamfleet_client.reconnecting import STATE_ATTEMPTS
from streamfleet_dev.dsim.live.heartbeat import (
    GIVE_UP_WITHIN_S,
    HEARTBEAT_INTERVAL_S,
    HeartbeatWatch,
)
from streamfleet_dev.dsim.live.state_restore import StateRestore


def _run(watch: HeartbeatWatch, until: float, *, answer: bool) -> list[tuple[float, str]]:
    events = []
    now = 0.0
    while now <= until:
        action = watch.tick(now)
        if action is not None:
            events.append((now, action))
        if action == "send" and answer:
            watch.last_pong_at = now + 0.01
        if action == "give up":
            break
        now = round(now + 0.5, 3)
    return events


def test_answered_heartbeats_are_sent_an_interval_after_the_last_pong_and_never_given_up() -> None:
    events = _run(HeartbeatWatch(0.0), 300.0, answer=True)
    assert {action for _, action in events} == {"send"}
    sent = [at for at, _ in events]
    assert sent[0] == HEARTBEAT_INTERVAL_S
    # The next one is due an interval after the pong (0.01 s after its heartbeat), seen on the
    # next tick (every 0.5 s).
    assert all(b - a == HEARTBEAT_INTERVAL_S + 0.5 for a, b in itertools.pairwise(sent))


def test_a_connection_that_stops_answering_is_given_up_after_its_missed_pongs() -> None:
    watch = HeartbeatWatch(0.0)
    assert watch.tick(20.0) == "send"
    watch.last_pong_at = 20.1  # the last answer: the Region is cut off right after it
    events = _run_from(watch, 20.5, 200.0)
    # A heartbeat an interval after the pong (seen at the next tick); its timeout, then given up.
    assert events == [(40.5, "send"), (50.5, "give up")]
    assert GIVE_UP_WITHIN_S == 30.0
    given_up_after = 50.5 - 20.1  # since the last pong
    assert given_up_after - 0.5 <= GIVE_UP_WITHIN_S  # within the bound, but for the tick


def _run_from(watch: HeartbeatWatch, start: float, until: float) -> list[tuple[float, str]]:
    events, now = [], start
    while now <= until:
        action = watch.tick(now)
        if action is not None:
            events.append((now, action))
            if action == "give up":
                break
        now = round(now + 0.5, 3)
    return events


def test_get_state_is_sent_at_once_again_after_an_error_or_a_timeout_then_given_up() -> None:
    restore = StateRestore(0.0, random.Random(1))
    assert restore.tick(0.0, "r1") == "send" and restore.request_id == "r1"
    assert restore.tick(5.0, "r2") is None  # waiting for the answer
    restore.failed("r1", 5.0)  # unavailable: sent again after a backoff
    sends, now = ["r1"], 5.0
    while now < 500.0:
        now += 0.5
        action = restore.tick(now, f"r{len(sends) + 1}")
        if action == "send":
            sends.append(restore.request_id)
        if action == "give up":
            break
    assert len(sends) == STATE_ATTEMPTS and action == "give up"
    assert not restore.answered("r1")  # an old request's reply is not this one's


def test_get_state_answered_is_ready_and_sent_no_more() -> None:
    restore = StateRestore(0.0, random.Random(1))
    restore.tick(0.0, "r1")
    assert restore.answered("r1") and restore.ready
    assert restore.tick(100.0, "r2") is None

"""The live simulation's client session: heartbeats decided as ``ReconnectingClient`` decides
them (a connection that answers nothing is given up after two missed pongs, within two
intervals plus the timeout), and getState sent again until answered, then given up."""

from __future__ import annotations

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


def test_answered_heartbeats_are_sent_every_interval_and_never_given_up() -> None:
    events = _run(HeartbeatWatch(0.0), 300.0, answer=True)
    assert [at for at, _ in events] == [HEARTBEAT_INTERVAL_S * n for n in range(1, 11)]
    assert {action for _, action in events} == {"send"}


def test_a_connection_that_stops_answering_is_given_up_after_two_missed_pongs() -> None:
    watch = HeartbeatWatch(0.0)
    assert watch.tick(30.0) == "send"
    watch.last_pong_at = 30.1  # the last answer: the Region is cut off right after it
    events = _run_from(watch, 30.5, 200.0)
    # The third goes out before the second's answer is due: as the real client, on its timers.
    assert events == [(60.0, "send"), (90.0, "send"), (120.0, "send"), (125.0, "give up")]
    assert 125.0 - 30.0 <= GIVE_UP_WITHIN_S == 95.0


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

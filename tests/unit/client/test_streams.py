"""The client cursor's promise to ask again (``streamfleet/client/streams.py``): a replay the
reply promised is awaited like a gap, on a quiet stream too."""

from __future__ import annotations

from streamfleet.client import StreamCursor

GAP_TIMEOUT = 2.0


def subscribed(cursor: StreamCursor, *, after: int, up_to: int, more: bool, now: float) -> None:
    cursor.acknowledged = True
    cursor.on_subscribed(
        {"type": "subscribed", "after": after, "upTo": up_to, "more": more, "replayed": 0}, now
    )


def test_a_promised_replay_that_never_arrives_is_asked_for_again_on_a_quiet_stream():
    """A replay cut after its reply (``more``) was never resumed on a quiet or stopped stream:
    the cursor only noticed a gap from a later message, and none came."""
    cursor = StreamCursor("s", position=0)
    subscribed(cursor, after=0, up_to=10, more=True, now=0)

    assert cursor.resubscribe_reason(GAP_TIMEOUT - 0.1, GAP_TIMEOUT) is None
    assert cursor.resubscribe_reason(GAP_TIMEOUT, GAP_TIMEOUT) == "gap"


def test_a_promised_replay_that_arrives_asks_for_more_and_nothing_else():
    cursor = StreamCursor("s", position=0)
    subscribed(cursor, after=0, up_to=2, more=True, now=0)
    entries = [{"seq": 1, "data": "a"}, {"seq": 2, "data": "b"}]
    cursor.on_entries(entries, source="replay", region="r", now=0.1)

    assert cursor.resubscribe_reason(0.2, GAP_TIMEOUT) == "more"
    cursor.count_resubscribe("more", 0.2)
    subscribed(cursor, after=2, up_to=2, more=False, now=0.3)  # caught up
    assert cursor.resubscribe_reason(100, GAP_TIMEOUT) is None

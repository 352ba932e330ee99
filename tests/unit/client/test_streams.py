"""The client cursor's promise to ask again (``streamfleet/client/streams.py``): a replay the
reply promised is awaited like a gap, on a quiet stream too."""

from __future__ import annotations

from streamfleet_client import StreamCursor, StreamPosition

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


def parts(seq: int, total: int, index: int, data: str) -> dict:
    return {"seq": seq, "part": index, "parts": total, "data": data}


def test_parts_of_different_cuts_never_join():
    """A lost live part refilled by a replay cut differently was joined: 59,998 of 60,000
    characters delivered."""
    cursor = StreamCursor("s", position=4)
    got = cursor.on_entries(
        [parts(5, 2, 0, "he"), parts(5, 3, 1, "XX"), parts(5, 2, 1, "llo")],
        source="live",
        region="r",
        now=0,
    )
    assert got == []  # no set was ever complete in one cut
    got = cursor.on_entries([parts(5, 2, 0, "he")], source="replay", region="r", now=1)
    assert [(m.seq, m.data) for m in got] == [(5, "hello")]


def test_incomplete_parts_are_bounded_in_bytes_and_in_count():
    """45 MB were held with max_buffered 100, from many seqs or one seq claiming 10**9 parts."""
    from streamfleet_client.streams import MAX_PART_BYTES

    cursor = StreamCursor("s", position=0)
    big = "p" * 65_536
    cursor.on_entries(
        [parts(seq, 2, 0, big) for seq in range(2, 200)], source="live", region="r", now=0
    )
    assert cursor.part_bytes <= MAX_PART_BYTES
    assert sum(len(p) for _, held in cursor.parts.values() for p in held.values()) == (
        cursor.part_bytes
    )
    cursor.on_entries([parts(1, 10**9, 0, "x")], source="live", region="r", now=0)
    assert 1 not in cursor.parts


async def test_frames_of_the_wrong_shape_or_not_asked_for_move_nothing():
    """A stream of the wrong type raised TypeError and ended the connection; an unsolicited
    ``subscribed`` with ``after: 1000`` silently skipped seqs 4 to 1000."""
    from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient

    client = ReconnectingClient(lambda attempt: Endpoint("ws://127.0.0.1:9", None), ClientConfig())
    cursor = StreamCursor("s", position=3)
    cursor.request_id = "mine"
    client.subscriptions["s"] = cursor

    await client._on_stream_frame("messages", {"stream": [], "messages": "no"}, now=0)
    await client._on_stream_frame(
        "subscribed", {"stream": "s", "after": 1000, "requestId": "not-mine"}, now=0
    )
    assert cursor.position == 3
    await client._on_stream_frame(
        "subscribed", {"stream": "s", "after": 3, "upTo": 3, "requestId": "mine"}, now=0
    )
    assert cursor.acknowledged


def test_a_refused_first_subscribe_is_asked_again_ever_more_patiently():
    """It was retried every gap timeout, each retry a full count of the stream's subscribers."""
    cursor = StreamCursor("s")
    cursor.acknowledged, cursor.gap_since = True, 0.0  # answered too_many_subscribers at 0
    assert cursor.resubscribe_reason(GAP_TIMEOUT, GAP_TIMEOUT) == "start"
    cursor.count_resubscribe("start", GAP_TIMEOUT)
    cursor.gap_since = GAP_TIMEOUT  # refused again
    assert cursor.resubscribe_reason(GAP_TIMEOUT * 2.5, GAP_TIMEOUT) is None
    assert cursor.resubscribe_reason(GAP_TIMEOUT * 3, GAP_TIMEOUT) == "start"


def test_the_parts_of_a_live_message_past_the_promised_replay_are_kept():
    """A live message stored after the replay's read posted its first part before the reply;
    dropping it left the message to a gap timeout."""
    cursor = StreamCursor("s", position=0)
    cursor.on_entries([parts(2, 2, 0, "hello ")], source="live", region="r", now=0)
    subscribed(cursor, after=0, up_to=1, more=False, now=1)
    cursor.on_entries([{"seq": 1, "data": "one"}], source="replay", region="r", now=2)
    got = cursor.on_entries([parts(2, 2, 1, "world")], source="live", region="r", now=3)
    assert [(m.seq, m.data) for m in got] == [(2, "hello world")]


def test_a_newer_epoch_is_awaited_like_a_gap_then_entered_once_with_an_event():
    """A stream whose upstream numbered from 1 again: its new seqs were dropped as duplicates of
    the old ones. An entry of a newer epoch now makes the cursor ask again; the reply that
    moves it there is reported once, and older epochs' entries are duplicates."""
    cursor = StreamCursor("s", position=5)
    cursor.acknowledged = True
    new = [{"seq": 1, "epoch": 1, "data": "n1"}, {"seq": 2, "epoch": 1, "data": "n2"}]

    assert cursor.on_entries(new, source="live", region="r", now=0) == []
    assert cursor.resubscribe_reason(GAP_TIMEOUT, GAP_TIMEOUT) == "gap"
    cursor.count_resubscribe("gap", GAP_TIMEOUT)
    reply = {"after": 0, "afterEpoch": 1, "upTo": 2, "upToEpoch": 1, "more": False}
    assert cursor.on_subscribed(reply, GAP_TIMEOUT) == []
    change = cursor.take_epoch_change()
    assert (change.stream, change.epoch, change.previous) == ("s", 1, 0)
    assert cursor.take_epoch_change() is None
    ready = cursor.on_entries(new, source="replay", region="r", now=GAP_TIMEOUT)
    assert [(m.epoch, m.seq, m.data) for m in ready] == [(1, 1, "n1"), (1, 2, "n2")]
    old = [{"seq": 6, "data": "late"}, {"seq": 7, "epoch": 0, "data": "later"}]
    assert cursor.on_entries(old, source="live", region="r", now=GAP_TIMEOUT) == []
    assert cursor.stats.duplicates == 2
    assert cursor.resubscribe_reason(100, GAP_TIMEOUT) is None


def test_moving_to_a_newer_epoch_drops_what_was_held_of_the_old():
    """The application's own position in a newer epoch kept the old epoch's buffer: its next
    seq was delivered as the new epoch's."""
    cursor = StreamCursor("s", position=5)
    cursor.on_entries([{"seq": 7, "data": "old 7"}], source="live", region="r", now=0)
    cursor.move_to(StreamPosition(1, 6))
    ready = cursor.on_entries(
        [{"seq": 7, "epoch": 1, "data": "new 7"}], source="live", region="r", now=0
    )
    assert [(m.epoch, m.seq, m.data) for m in ready] == [(1, 7, "new 7")]


def test_a_forward_jump_is_told_to_the_application_once():
    """A reply that moved the cursor past seqs the log will never hold did so without a word."""
    cursor = StreamCursor("s", position=5)
    subscribed(cursor, after=9, up_to=9, more=False, now=0)
    skip = cursor.take_skip()
    assert (skip.stream, skip.epoch, skip.after, skip.to) == ("s", 0, 5, 9)
    assert cursor.take_skip() is None
    first = StreamCursor("t")  # a first subscribe from the newest: no jump
    subscribed(first, after=40, up_to=40, more=False, now=0)
    assert first.take_skip() is None


def test_the_new_epochs_seqs_the_log_no_longer_holds_are_told_after_the_epoch_change():
    """A reply that moved the cursor into a newer epoch past its first seqs (TTL deleted them
    before the client caught up) told the epoch change only: the application never learnt
    that seqs 1 to 9 of the new epoch were lost."""
    cursor = StreamCursor("s", position=5)
    cursor.acknowledged = True
    cursor.on_subscribed(
        {"type": "subscribed", "after": 9, "afterEpoch": 1, "upTo": 9, "upToEpoch": 1,
         "more": False, "replayed": 0},
        0,
    )  # fmt: skip
    change, skip = cursor.take_epoch_change(), cursor.take_skip()
    assert (change.epoch, change.previous) == (1, 0)
    assert (skip.epoch, skip.after, skip.to) == (1, 0, 9)
    entered = StreamCursor("t", position=5)  # into the new epoch at its start: nothing lost
    entered.acknowledged = True
    entered.on_subscribed(
        {"type": "subscribed", "after": 0, "afterEpoch": 1, "upTo": 0, "upToEpoch": 1,
         "more": False, "replayed": 0},
        0,
    )  # fmt: skip
    assert entered.take_epoch_change() is not None and entered.take_skip() is None


def test_a_quiet_stream_asks_where_its_log_ends_ever_more_patiently():
    """A live post lost with its connection open (a fan-out out of time, a batch given up) was
    found only by a later message: after a stream's last one, never. A quiet stream now asks,
    after the quiet timeout, then twice as long each time it finds nothing (a delivery does not
    make it eager again: a slow stream would pay a subscribe per message); one that finds a
    lost tail does; never while a gap is already being waited for."""
    quiet = 60.0
    cursor = StreamCursor("s", position=0)
    subscribed(cursor, after=0, up_to=0, more=False, now=0)
    cursor.on_entries([{"seq": 1, "data": "a"}], source="live", region=None, now=1)
    assert cursor.resubscribe_reason(1 + quiet - 0.1, GAP_TIMEOUT, quiet) is None
    assert cursor.resubscribe_reason(1 + quiet, GAP_TIMEOUT, quiet) == "quiet"
    assert cursor.resubscribe_reason(1 + quiet, GAP_TIMEOUT) is None  # off without a timeout
    cursor.count_resubscribe("quiet", 1 + quiet)
    subscribed(cursor, after=1, up_to=1, more=False, now=1 + quiet)  # nothing new
    assert cursor.resubscribe_reason(1 + 3 * quiet - 0.1, GAP_TIMEOUT, quiet) is None
    assert cursor.resubscribe_reason(1 + 3 * quiet, GAP_TIMEOUT, quiet) == "quiet"
    assert cursor.stats.quiet_resubscribes == 1
    cursor.on_entries([{"seq": 2, "data": "b"}], source="live", region=None, now=500)
    assert cursor.quiet_attempts == 1  # still patient
    cursor.count_resubscribe("quiet", 500 + 2 * quiet)
    subscribed(cursor, after=2, up_to=3, more=False, now=500 + 2 * quiet)  # a lost tail: seq 3
    assert cursor.quiet_attempts == 0
    # The tail is now awaited as a gap, and no quiet subscribe mixes into its backoff.
    assert cursor.resubscribe_reason(500 + 3 * quiet, GAP_TIMEOUT, quiet) == "gap"

"""The default upstream protocol: resume with ``last_seq``; every frame judged alone, strictly,
and what it carries kept exactly as sent."""

from __future__ import annotations

import pytest

from streamfleet.worker.protocol import JsonSeqProtocol, ProtocolError, UpstreamMessage


def test_the_default_protocol_resumes_with_last_seq_in_the_query():
    protocol = JsonSeqProtocol()
    assert protocol.dial_url("ws://h/s?a=1", resume_after=None, epoch=1) == "ws://h/s?a=1&epoch=1"
    assert protocol.dial_url("ws://h/s", resume_after=0, epoch=2) == "ws://h/s?last_seq=0&epoch=2"
    assert (
        protocol.dial_url("ws://h/s?a=1&last_seq=3&epoch=1", resume_after=42, epoch=7)
        == "ws://h/s?a=1&last_seq=42&epoch=7"
    )


@pytest.mark.parametrize(
    "frame",
    [
        "nope",
        "[1]",
        '{"data": 1}',
        '{"seq": 0}',
        '{"seq": true}',
        '{"seq": 1.0}',
        '{"seq": -3}',
        '{"seq": "4"}',
        '{"seq": 1} trailing',
        '{"seq": 1, "seq": 2}',  # which one?
        b"\xff\xfe",  # a binary frame that is not UTF-8
    ],
)
def test_malformed_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        JsonSeqProtocol().parse(frame)


@pytest.mark.parametrize(
    "frame",
    [
        '{"seq": ' + "9" * 5000 + "}",  # past Python's int-from-text limit
        '{"seq": 5, "data": ' + "[" * 5000 + "]" * 5000 + "}",  # deeper than the parser recurses
        '{"seq": 5, "data": NaN}',
        '{"seq": 5, "data": [Infinity]}',
        '{"seq": 5, "data": "\\ud800"}',  # a lone surrogate: no UTF-8 for it, DynamoDB refuses it
        '{"seq": 100000000000000000000000000000000000000}',  # 10**38: past a DynamoDB number
    ],
)
def test_poison_frames_are_protocol_errors_not_crashes(frame):
    """They raised ValueError or RecursionError, which ended the connection and had the stream
    re-claimed about 13 times a second for ever."""
    with pytest.raises(ProtocolError):
        JsonSeqProtocol().parse(frame)


@pytest.mark.parametrize(
    ("frame", "data"),
    [
        ('{"seq": 2, "data": 1e400}', "1e400"),  # was stored as Infinity (not JSON)
        ('{"seq": 2, "data": 0.10000000000000000000001}', "0.10000000000000000000001"),
        ('{"seq": 2, "data": {"a": 1, "a": 2}}', '{"a": 1, "a": 2}'),  # was collapsed
        ('{"seq": 2, "data": [1, 2]}', "[1, 2]"),
        ('{"seq":2,"data":{ "nested" :[true,null,-0.0e-0]} }', '{ "nested" :[true,null,-0.0e-0]}'),
        # It raised ValueError (past Python's int-from-text limit): valid JSON, kept as text.
        ('{"seq": 2, "data": ' + "1" * 5000 + "}", "1" * 5000),
        ('{"seq": 2}', "null"),
    ],
)
def test_a_json_value_is_kept_byte_for_byte(frame, data):
    assert JsonSeqProtocol().parse(frame) == UpstreamMessage(seq=2, data=data, json=True)


def test_a_string_and_the_json_value_it_spells_stay_distinct():
    protocol = JsonSeqProtocol()
    text = protocol.parse('{"seq": 3, "data": "[1, 2]"}')
    array = protocol.parse('{"seq": 3, "data": [1, 2]}')
    assert (text.data, text.json) == ("[1, 2]", False)
    assert (array.data, array.json) == ("[1, 2]", True)


def test_a_binary_frame_is_read_as_utf8_text():
    message = JsonSeqProtocol().parse('{"seq": 9, "data": "caf\u00e9 \u2603"}'.encode())
    assert message == UpstreamMessage(seq=9, data="caf\u00e9 \u2603")
    assert message.data_bytes == len("caf\u00e9 \u2603".encode())


def test_the_largest_seq_every_client_counts_exactly_is_the_limit():
    """9007199254740993 was stored; a client's next subscribe from there got bad_request (the
    API takes positions up to 2**53 - 1), and the subscription was dropped for good."""
    assert JsonSeqProtocol().parse('{"seq": 9007199254740991}').seq == 2**53 - 1
    with pytest.raises(ProtocolError):
        JsonSeqProtocol().parse('{"seq": 9007199254740992}')

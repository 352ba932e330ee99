"""The default upstream protocol: resume with ``last_seq``, malformed frames refused."""

from __future__ import annotations

import pytest

from streamfleet.worker.protocol import JsonSeqProtocol, ProtocolError


def test_the_default_protocol_resumes_with_last_seq_in_the_query():
    protocol = JsonSeqProtocol()
    assert protocol.dial_url("ws://h/s?a=1", resume_after=None, epoch=1) == "ws://h/s?a=1&epoch=1"
    assert protocol.dial_url("ws://h/s", resume_after=0, epoch=2) == "ws://h/s?last_seq=0&epoch=2"
    assert (
        protocol.dial_url("ws://h/s?a=1&last_seq=3&epoch=1", resume_after=42, epoch=7)
        == "ws://h/s?a=1&last_seq=42&epoch=7"
    )
    message = protocol.parse('{"seq": 7, "data": {"x": 1}}')
    assert (message.seq, message.data) == (7, {"x": 1})


@pytest.mark.parametrize("frame", ["nope", "[1]", '{"data": 1}', '{"seq": 0}', '{"seq": true}'])
def test_malformed_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        JsonSeqProtocol().parse(frame)

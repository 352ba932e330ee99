"""The fault simulation's own rules, without a world: the one-owner checker's verdict on a killed
holder, and what a simulated kill does to the sockets of the killed worker's loop."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from streamfleet_dev.sim.checker import one_owner_problems
from streamfleet_dev.sim.world import History, Window, _reset


def _world(first: Window, second: Window, *, killed_at: float | None) -> SimpleNamespace:
    """Two holders of one stream in a row; the first one's deadline is at 3.0."""
    history = History(windows=[first, second])
    history.deadlines[(first.worker, first.session_version)] = [(0.0, 3.0)]
    history.deadlines[(second.worker, second.session_version)] = [(0.0, 9.0)]
    workers = {
        first.worker: SimpleNamespace(worker_id=first.worker, killed_at=killed_at),
        second.worker: SimpleNamespace(worker_id=second.worker, killed_at=None),
    }
    upstream = SimpleNamespace(stats=lambda: {"overlaps": {}})
    return SimpleNamespace(name="t", history=history, workers=workers, upstream=upstream)


@pytest.mark.parametrize(
    ("stopped", "killed_at", "overlap"),
    [
        # Killed after it had stopped receiving and released, before it recorded the release: it
        # acted until it stopped, not until its deadline (a successor may claim the released row).
        (1.0, 1.2, False),
        # Killed while still receiving, after the successor began: both acted at once.
        (None, 2.0, True),
        # Not killed and not finished: it may still act until its deadline.
        (1.0, None, True),
    ],
)
def test_the_one_owner_check_ends_a_killed_holder_at_its_kill(stopped, killed_at, overlap):
    first = Window("w0-1", "CONN#s", 1, 1, began=0.5, stopped=stopped)
    second = Window("w1-1", "CONN#s", 2, 2, began=1.5, stopped=None, finished=2.5)
    problems = one_owner_problems(_world(first, second, killed_at=killed_at))
    assert bool(problems) is overlap, problems


def test_a_kill_resets_tcp_sockets_known_only_by_their_descriptor():
    """A dial caught mid-handshake by a kill is in the loop's selector as a bare descriptor: the
    kill must still reset it (the peer sees the connection end), and leave the loop's own
    self-pipe, an AF_UNIX socket, alone."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    pipe_a, pipe_b = socket.socketpair()
    try:
        _reset(client.fileno(), tcp_only=True)
        _reset(pipe_a.fileno(), tcp_only=True)
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # the peer sees the end of the connection
        pipe_a.sendall(b"x")
        assert pipe_b.recv(1) == b"x"  # the self-pipe still works
    finally:
        for sock in (server, client, accepted, pipe_a, pipe_b):
            sock.close()

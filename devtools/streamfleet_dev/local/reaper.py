"""Nothing local mode started outlives it, however it ends.

Local mode's servers, workers and functions run in sessions of their own (so that a Ctrl-C
reaches local mode, which stops them in order), so no terminal's signal ends them. Each of them
gets SIGKILL from the kernel when its parent ends (lifeline.py: the parent-death signal); the
reaper is the second line, for what that does not reach: the children of third-party tools
(``cdk synth``'s app, pip's) and anything started otherwise. Every process local mode starts
inherits a mark, ``STREAMFLEET_LOCAL_RUN=<token>`` in its environment, a token of its own run
(the launchers of workers and Lambda functions pass it through). The reaper is a small process
of its own that local mode starts first and holds a pipe to; when the pipe ends (local mode has
exited, whatever the reason: the kernel closes the pipe of a killed process too) it stops every
process that carries the mark and started after the reaper did (so never local mode's own
parents): SIGTERM, then SIGKILL, until none is left. After an orderly stop there is nothing
left, and the reaper exits saying so.

Run by local mode as ``python -m streamfleet_dev.local.reaper <token>`` (see :class:`Reaper`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamfleet_dev.emulator.servers import LOCAL_RUN_VARIABLE

GRACE_SECONDS = 10.0  # what an orderly stop (a worker's handoff) may take after SIGTERM


def process_stat(pid: int | str) -> tuple[int, int]:
    """A process's parent and when it started, in clock ticks since boot (``/proc/<pid>/stat``;
    the command may hold spaces and parentheses, so the fields are read after its last ``)``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def marked(token: str, *, variable: str = LOCAL_RUN_VARIABLE, since: int = 0) -> dict[int, int]:
    """``pid -> start time`` of the processes started at or after ``since`` (clock ticks since
    boot) whose environment carries ``variable=token``, this one excepted."""
    mark = f"{variable}={token}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            started = process_stat(entry.name)[1]
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, a zombie's, or not ours to read
            continue
        if started >= since and mark in environment.split(b"\0"):
            found[int(entry.name)] = started
    return found


def _signal(pid: int, started: int, signum: int) -> None:
    """Signal ``pid`` if it is still the process that started then (pids are reused)."""
    with contextlib.suppress(OSError):
        if process_stat(pid)[1] == started:
            os.kill(pid, signum)


def reap(token: str, grace: float = GRACE_SECONDS, since: int = 0) -> list[int]:
    """Stop every process marked with ``token`` and started since ``since``: SIGTERM (after
    SIGCONT: a paused worker cannot act on it), to those that appear meanwhile too, then
    SIGKILL what is left after ``grace``, until none is left. Returns the pids it killed."""
    told: set[int] = set()
    deadline = time.monotonic() + grace
    while (left := marked(token, since=since)) and time.monotonic() < deadline:
        for pid, started in left.items():
            if pid not in told:
                told.add(pid)
                for signum in (signal.SIGCONT, signal.SIGTERM):
                    _signal(pid, started, signum)
        time.sleep(0.1)
    killed: dict[tuple[int, int], None] = {}
    deadline = time.monotonic() + grace
    # A process started between two scans is found by the next one; one the kernel cannot end
    # (stuck in I/O) is given up on after another grace.
    while left and time.monotonic() < deadline:
        for pid, started in left.items():
            _signal(pid, started, signal.SIGKILL)
            killed[(pid, started)] = None
        time.sleep(0.1)
        left = marked(token, since=since)
    return [pid for pid, _ in killed]


class Reaper:
    """Local mode's side: start the reaper before anything else, :meth:`close` at the very end
    (or never: exiting closes the pipe as well)."""

    def __init__(self, token: str, log_path: Path | None = None):
        self.token = token
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Reaper:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streamfleet_dev.local.reaper", self.token],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                # Not in local mode's process group: a closed terminal's SIGHUP must not end it.
                start_new_session=True,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        return self

    def close(self) -> None:
        """End the pipe: the reaper stops whatever is still marked, then exits."""
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0]:
        print("usage: python -m streamfleet_dev.local.reaper <token>", file=sys.stderr)
        return 2
    # Local mode's own signals are not ours: only the end of the pipe ends this process.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    since = process_stat(os.getpid())[1]  # local mode and its parents started before
    while sys.stdin.buffer.read(4096):
        pass
    stopped = marked(args[0], since=since)
    killed = reap(args[0], since=since)
    print(
        f"reaper: {len(stopped)} processes were left; "
        f"{len(killed)} needed SIGKILL after {GRACE_SECONDS:g} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Nothing local mode started outlives it, however it ends.

Local mode's servers, workers and functions run in sessions of their own (so that a Ctrl-C
reaches local mode, which stops them in order), so nothing ties their life to local mode's: a
``kill -9`` of local mode, or a crash, would leave them running. Every process local mode starts
inherits a mark, ``STREAMFLEET_LOCAL_RUN=<token>`` in its environment (the launchers of workers
and Lambda functions pass it through). The reaper is a small process of its own that local mode
starts first and holds a pipe to; when the pipe ends (local mode has exited, whatever the
reason: the kernel closes the pipe of a killed process too) it stops every process that still
carries the mark: SIGTERM, then SIGKILL for what is left after a grace period. After an orderly
stop there is nothing left, and the reaper just exits.

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

from .servers import LOCAL_RUN_VARIABLE

GRACE_SECONDS = 10.0  # what an orderly stop (a worker's handoff) may take after SIGTERM


def marked(token: str, *, variable: str = LOCAL_RUN_VARIABLE) -> list[int]:
    """The processes whose environment carries ``variable=token``, this one excepted."""
    mark = f"{variable}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, a zombie's, or not ours to read
            continue
        if mark in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def reap(token: str, grace: float = GRACE_SECONDS) -> list[int]:
    """Stop every process marked with ``token``: SIGTERM (after SIGCONT, a paused worker cannot
    act on it), then SIGKILL what is left after ``grace``. Returns the pids that were killed."""
    for pid in marked(token):
        for signum in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
    deadline = time.monotonic() + grace
    while (left := marked(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


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
    while sys.stdin.buffer.read(4096):
        pass
    killed = reap(args[0])
    if killed:
        print(f"reaper: killed {len(killed)} processes left after {GRACE_SECONDS:g} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

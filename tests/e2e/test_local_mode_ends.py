"""Local mode leaves nothing running, however it ends: ``kill -9`` (of local mode and of its
reaper too, so that nothing but the kernel's parent-death signal can act), SIGTERM, Ctrl-C
(SIGINT from its terminal), a closed terminal (the pseudo-terminal's master closed: the kernel
sends SIGHUP to local mode, the terminal's controlling process) and ``tmux kill-session`` (the
issue's case; skipped where tmux is not installed, the closed terminal covers the same SIGHUP).

Each run is ``python -m streamfleet_dev.local.mode`` with one worker and one stream, and
everything else as ``make local`` has it: moto, dynalite, the fake upstream, the event router
and the task-events handler (Lambda runners), the regions process and its two fan-out Lambda
runners, the worker, the reaper. What it started is identified by its run's mark
(``STREAMFLEET_LOCAL_RUN=<token>`` in the environment, the token read from the reaper's command
line) and, before the end, as local mode's descendants (pid and start time, in case one lost
its mark); after the end none of them may run. Linux only (``/proc``, the parent-death signal).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamfleet_dev import lifeline
from streamfleet_dev.local.reaper import marked, process_stat, reap

pytestmark = pytest.mark.skipif(not lifeline.AVAILABLE, reason="Linux's parent-death signal")

REPO = Path(__file__).resolve().parents[2]
TOOLS_PATH = os.pathsep.join(str(REPO / d) for d in ("runtime", "devtools", "."))
START_TIMEOUT = 240.0  # a cold start synthesizes the assembly and installs the image's packages
# The deadlines, 10 x what each end takes here: after kill -9 the kernel's SIGKILLs end every
# process within a second; an orderly stop (the worker hands over, then the Lambda runners,
# the regions, the upstream and the servers stop in turn) takes about 4 s.
KILLED_DEADLINE = 10.0
ORDERLY_DEADLINE = 40.0
# Local mode's children with --workers 1 (command-line patterns, how many of each).
EXPECTED = {
    "the reaper": (r"-m streamfleet_dev\.local\.reaper ", 1),
    "moto": (r"-m moto\.server", 1),
    "dynalite": (r"dynalite-server\.js", 1),
    "the fake upstream": (r"-m streamfleet_dev\.upstream\.fake", 1),
    "the regions process": (r"-m streamfleet_dev\.wsapi\.regions", 1),
    "Lambda runners (router, task events, two fan-outs)": (r"_lambda_bootstrap\.py", 4),
    "the worker": (r"-m streamfleet\.worker", 1),
}
TMUX = shutil.which("tmux")
# Makes stdin (the pseudo-terminal) the controlling terminal of the new session it runs in,
# then runs local mode: as a terminal emulator starts its shell, so that closing the terminal
# sends local mode SIGHUP.
WITH_CONTROLLING_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def stat(pid: int) -> tuple[str, int] | None:
    """A process's state and start time, or None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def running(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not), and is the process that started then."""
    now = stat(pid)
    return now is not None and now[0] != "Z" and (started is None or now[1] == started)


def descendants(root: int) -> dict[int, int]:
    """``pid -> start time`` of every live descendant of ``root``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = process_stat(entry.name)[0]
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found and (now := stat(pid)) and now[0] != "Z":
                found[pid] = now[1]
                frontier.append(pid)
    return found


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def poll(check: Callable[[], object], *, timeout: float, what: Callable[[], str]) -> float:
    """Poll ``check`` every 0.1 s until it is truthy; the seconds it took. Fails at ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"after {timeout:g} s: {what()}")
        time.sleep(0.1)
    return time.monotonic() - started


class LocalMode:
    """One local mode run, in a pseudo-terminal of its own or in a tmux session."""

    def __init__(self, tmp: Path, *, tmux: bool):
        self.env_file = tmp / "env"
        self.reaper_log = tmp / "reaper.log"
        self.tmux_socket = f"streamfleet-ends-{os.getpid()}-{tmp.name}" if tmux else ""
        self.master = -1
        self.process: subprocess.Popen[bytes] | None = None
        arguments = [
            "-m",
            "streamfleet_dev.local.mode",
            "--workers",
            "1",
            "--streams",
            "1",
            "--env-file",
            str(self.env_file),
            "--reaper-log",
            str(self.reaper_log),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env.update(TERM="xterm-256color", PYTHONPATH=TOOLS_PATH)
        if tmux:
            command = shlex.join(["env", f"PYTHONPATH={TOOLS_PATH}", sys.executable, *arguments])
            window = ("-x", "120", "-y", "40", "-c", str(REPO))
            self.tmux("new-session", "-d", "-s", "local", *window, f"exec {command}")
            self.pid = int(self.tmux("list-panes", "-t", "local", "-F", "#{pane_pid}"))
        else:
            master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            self.process = subprocess.Popen(
                [sys.executable, "-c", WITH_CONTROLLING_TERMINAL, *arguments],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
            os.close(slave)
            self.master = master
            self.pid = self.process.pid
            # The terminal's side: what local mode draws is read (it would block on a full
            # terminal otherwise) until the terminal is closed.
            threading.Thread(target=self._drain, args=(master,), daemon=True).start()

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run(
            [TMUX, "-L", self.tmux_socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.strip()

    @staticmethod
    def _drain(master: int) -> None:
        with contextlib.suppress(OSError):
            while os.read(master, 65536):
                pass

    def up(self) -> dict[int, int]:
        """Wait for the live view (the exports are written just before it); every descendant."""
        poll(
            lambda: self.env_file.exists() or not running(self.pid),
            timeout=START_TIMEOUT,
            what=lambda: "local mode's live view",
        )
        assert running(self.pid), "local mode exited while starting"
        return descendants(self.pid)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close_terminal(self) -> None:
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def reaper_report(self) -> str:
        """What the reaper said once local mode had gone ("" until then)."""
        with contextlib.suppress(OSError):
            return self.reaper_log.read_text()
        return ""

    def exited(self) -> bool:
        if self.process is not None:
            return self.process.poll() is not None
        return not running(self.pid)

    def clean_up(self, token: str | None) -> None:
        """After a failure: nothing of this run may outlive the test."""
        with contextlib.suppress(OSError):
            if running(self.pid):
                os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        if token:
            reap(token, grace=0)
        self.close_terminal()
        if self.tmux_socket:
            with contextlib.suppress(subprocess.SubprocessError):
                self.tmux("kill-server")


ENDINGS = ("kill -9", "SIGTERM", "Ctrl-C", "closed terminal", "tmux kill-session")


@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_local_mode_started_outlives_it(ending: str, tmp_path: Path) -> None:
    if ending == "tmux kill-session" and TMUX is None:
        pytest.skip("tmux is not installed (the closed terminal is the same SIGHUP)")
    mode = LocalMode(tmp_path, tmux=ending == "tmux kill-session")
    token = None
    try:
        started = mode.up()
        commands = {pid: command_line(pid) for pid in started}
        reaper = next(p for p, c in commands.items() if "streamfleet_dev.local.reaper" in c)
        token = commands[reaper].split()[-1]
        for kind, (pattern, count) in EXPECTED.items():
            found = [pid for pid, command in commands.items() if re.search(pattern, command)]
            assert len(found) == count, f"{kind}: {found} of {commands}"
        assert set(marked(token)) >= set(started), "every process it started carries its mark"

        if ending == "kill -9":  # its reaper first: only the parent-death signal is left
            os.kill(reaper, signal.SIGKILL)
            os.kill(mode.pid, signal.SIGKILL)
        elif ending == "SIGTERM":
            os.kill(mode.pid, signal.SIGTERM)
        elif ending == "Ctrl-C":
            mode.type("\x03")  # the terminal sends its foreground group SIGINT
        elif ending == "closed terminal":
            mode.close_terminal()
        else:
            mode.tmux("kill-session", "-t", "local")

        def left() -> dict[int, str]:
            alive = {pid for pid, since in started.items() if running(pid, since)}
            return {pid: command_line(pid) for pid in alive | set(marked(token))}

        deadline = KILLED_DEADLINE if ending == "kill -9" else ORDERLY_DEADLINE
        took = poll(
            lambda: mode.exited() and not left(),
            timeout=deadline,
            what=lambda: f"local mode exited: {mode.exited()}; still running: {left()}",
        )
        print(f"{ending}: {len(started)} processes gone {took:.1f} s after the end")
        if ending != "kill -9":
            # Stopped in order by local mode itself, its reaper found nothing left to stop.
            if mode.process is not None:
                assert mode.process.returncode == 0, mode.process.returncode
            poll(mode.reaper_report, timeout=deadline, what=lambda: "the reaper's report")
            report = mode.reaper_report()
            assert "reaper: 0 processes were left" in report, report
    finally:
        mode.clean_up(token)

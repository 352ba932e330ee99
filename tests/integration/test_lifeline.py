"""The parent-death signal (streamfleet_dev.lifeline): a child started through it dies
when its parent is killed with ``kill -9``, wherever in the parent it was started (the main
thread, a thread that has since ended, a thread pool's), and so does its own child; a child
started the plain way survives the same kill (what the mechanism changes). The wrapper that
arms the signal ends itself when its parent is already gone, and ``popen``/``run`` keep
``subprocess``'s behaviour otherwise."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streamfleet_dev import lifeline

pytestmark = pytest.mark.skipif(not lifeline.AVAILABLE, reason="the parent-death signal is Linux's")

# SIGKILL from the kernel ends a child within milliseconds of its parent's death: 10 x 1 s.
DEADLINE = 10.0
START_TIMEOUT = 60.0  # a few interpreters starting on a busy machine

# A parent that starts children through lifeline from its main thread, from a thread that then
# ends, from a thread pool that is then shut down, and one (the control) with plain subprocess.
# Each child echoes a line once it runs its command (its signal armed, while its starter thread
# still runs), and another once those threads are gone from /proc/self/task (a child killed by
# the end of its starter thread could not); then the parent prints the pids and waits.
PARENT = textwrap.dedent(
    """
    import concurrent.futures, os, subprocess, sys, threading, time
    from streamfleet_dev import lifeline

    def echoes(child):
        try:
            child.stdin.write(b"ping\\n")
            child.stdin.flush()
            answer = child.stdout.readline()
        except BrokenPipeError:
            answer = b""
        assert answer == b"ping\\n", "a child died with its starter thread"

    def start():  # answers two lines, then waits (on nothing the parent holds)
        child = lifeline.popen(
            ["sh", "-c", 'read a; echo "$a"; read b; echo "$b"; exec sleep 600'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
        echoes(child)
        return child

    children = [start()]
    thread = threading.Thread(target=lambda: children.append(start()))
    thread.start()
    thread.join()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        children.append(pool.submit(start).result())
    control = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while len(os.listdir("/proc/self/task")) > 2:  # this thread and the spawner
        assert time.monotonic() < deadline, os.listdir("/proc/self/task")
        time.sleep(0.01)
    for child in children:
        echoes(child)
    print(control.pid, *(child.pid for child in children), flush=True)
    time.sleep(600)
    """
)

# A child that starts a child of its own through lifeline: each level arms it for the next.
MIDDLE = textwrap.dedent(
    """
    import subprocess, time
    from streamfleet_dev import lifeline

    grandchild = lifeline.popen(["sleep", "600"], stdout=subprocess.DEVNULL)
    print(grandchild.pid, flush=True)
    time.sleep(600)
    """
)
GRANDPARENT = textwrap.dedent(
    f"""
    import subprocess, sys, time
    from streamfleet_dev import lifeline

    middle = lifeline.popen([sys.executable, "-c", {MIDDLE!r}], stdout=subprocess.PIPE)
    print(middle.pid, middle.stdout.readline().decode().strip(), flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """Running, not a zombie (``/proc/<pid>/stat``'s state)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pids: list[int], deadline: float) -> float:
    """Seconds until none of ``pids`` runs; fails at ``deadline``."""
    started = time.monotonic()
    while left := [pid for pid in pids if alive(pid)]:
        assert time.monotonic() - started < deadline, f"still running: {left}"
        time.sleep(0.02)
    return time.monotonic() - started


def start_parent(script: str) -> tuple[subprocess.Popen[str], list[int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert parent.stdout is not None
    ready, _, _ = select.select([parent.stdout], [], [], START_TIMEOUT)
    line = parent.stdout.readline() if ready else ""
    if not line:
        parent.kill()
        raise AssertionError(f"the parent exited with {parent.wait()} before its children ran")
    return parent, [int(pid) for pid in line.split()]


def test_children_die_with_their_parent_wherever_it_started_them() -> None:
    parent, (control, *children) = start_parent(PARENT)
    try:
        assert all(alive(pid) for pid in (control, *children))
        parent.kill()
        parent.wait()
        took = gone_within(children, DEADLINE)
        assert alive(control), "the plain child survives its parent's kill -9"
        print(f"children gone {took:.3f} s after kill -9 of their parent")
    finally:
        parent.kill()
        for pid in (control, *children):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_grandchild_dies_with_its_parent_when_the_grandparent_is_killed() -> None:
    grandparent, (middle, grandchild) = start_parent(GRANDPARENT)
    try:
        assert alive(middle) and alive(grandchild)
        grandparent.kill()
        grandparent.wait()
        gone_within([middle, grandchild], DEADLINE)
    finally:
        grandparent.kill()
        for pid in (middle, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_wrapper_ends_itself_when_its_parent_is_already_gone() -> None:
    # Told that its parent is pid 1, it finds another: the parent it was started for died
    # before the signal was armed, so it ends the way the signal would have ended it.
    wrapper = [sys.executable, "-I", "-S", "-c", lifeline.ARM, str(int(lifeline.SIGNAL)), "1"]
    finished = subprocess.run([*wrapper, "sleep", "600"], timeout=DEADLINE, check=False)
    assert finished.returncode == -lifeline.SIGNAL


def test_popen_and_run_behave_as_subprocess_does(tmp_path: Path) -> None:
    process = lifeline.popen(["sh", "-c", "exit 3"])
    assert process.wait(DEADLINE) == 3
    assert process.args == ["sh", "-c", "exit 3"]
    with pytest.raises(FileNotFoundError):
        lifeline.popen(["no-such-program-here"])
    assert lifeline.run("echo $0", shell=True, capture_output=True, text=True).stdout == "/bin/sh\n"
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    shown = lifeline.run(["./tool"], cwd=tmp_path, capture_output=True, text=True)
    assert Path(shown.stdout.strip()).resolve() == tmp_path.resolve()
    shown = lifeline.run(["whatever"], executable="/bin/echo", capture_output=True, text=True)
    assert shown.args == ["whatever"] and shown.stdout == "\n"
    assert lifeline.run(["cat"], input="in", capture_output=True, text=True).stdout == "in"
    with pytest.raises(subprocess.CalledProcessError):
        lifeline.run(["false"], check=True)
    with pytest.raises(subprocess.TimeoutExpired):
        lifeline.run(["sleep", "60"], timeout=0.2)
    # The command gets the signal dispositions it would get from subprocess: the wrapper's
    # interpreter ignores SIGPIPE, the command must not inherit that.
    status = ["grep", "^Sig[IC]", "/proc/self/status"]
    assert (
        lifeline.run(status, capture_output=True).stdout
        == subprocess.run(status, capture_output=True, check=False).stdout
    )

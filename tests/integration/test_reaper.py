"""Nothing local mode started outlives it: its reaper stops every process carrying local mode's
mark once local mode has gone, even after a ``kill -9`` that left no chance to clean up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from streamfleet_dev.emulator.servers import LOCAL_RUN_VARIABLE
from streamfleet_dev.local.reaper import marked, reap

DEADLINE = 30.0  # the reaper's grace (10 s) and then some

# Local mode's shape: the reaper first, then servers in sessions of their own.
LOCAL_MODE_STAND_IN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from streamfleet_dev.local.reaper import Reaper
    Reaper(os.environ["STREAMFLEET_LOCAL_RUN"]).start()
    for _ in range(2):
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
    print("ready", flush=True)
    time.sleep(600)
    """
)


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_killed_local_mode_leaves_no_process_behind() -> None:
    token = uuid.uuid4().hex
    mode = subprocess.Popen(
        [sys.executable, "-c", LOCAL_MODE_STAND_IN],
        env={**os.environ, LOCAL_RUN_VARIABLE: token},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mode.stdout is not None and mode.stdout.readline().strip() == "ready"
        # local mode, its reaper and its two servers
        wait_until(lambda: len(marked(token)) == 4, "the stand-in's processes all started")
        mode.send_signal(signal.SIGKILL)
        mode.wait()
        wait_until(lambda: not marked(token), f"left after local mode died: {list(marked(token))}")
    finally:
        mode.kill()
        reap(token, grace=0)


def test_what_ignores_sigterm_is_killed_after_the_grace() -> None:
    token = uuid.uuid4().hex
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        env={**os.environ, LOCAL_RUN_VARIABLE: token},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        assert reap(token, grace=0.5) == [stubborn.pid]
        assert stubborn.wait(DEADLINE) == -signal.SIGKILL
    finally:
        stubborn.kill()

"""The fake upstream in a process of its own, for runs where the driver's event loop is busy.

A chaos run or a local fleet polls DynamoDB from its own loop; an upstream sharing that loop
would see sockets close late and count clients that are already gone. Out of process, its view
is its own, read through ``GET /stats``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import streamfleet
import streamfleet_dev
from streamfleet_dev import lifeline
from streamfleet_dev.upstream.fake import stream_url

START_TIMEOUT_SECONDS = 20.0
# The fake upstream imports the dev tools and the runtime's protocol constants: both packages'
# directories, wherever this process found them.
_TOOLS_PATH = os.pathsep.join(
    str(Path(module.__file__).resolve().parents[1]) for module in (streamfleet, streamfleet_dev)
)


class UpstreamProcess:
    """``python -m streamfleet_dev.upstream.fake`` as a child process; same addresses and stats."""

    def __init__(
        self,
        *,
        rate: float,
        keepalive_seconds: float | None = None,
        port: int = 0,
        log_path: Path | None = None,
    ):
        self._args = ["--rate", str(rate), "--port", str(port)]
        if keepalive_seconds:
            self._args += ["--keepalive", str(keepalive_seconds)]
        self._log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    @classmethod
    def attached(cls, url: str) -> Self:
        """One started by another process, at ``url``: this one only reads it (stop does
        nothing)."""
        upstream = cls(rate=0)
        upstream.url = url
        return upstream

    def start(self) -> Self:
        stderr = open(self._log_path, "a") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = lifeline.popen(
            [sys.executable, "-m", "streamfleet_dev.upstream.fake", *self._args],
            env={**os.environ, "PYTHONPATH": _TOOLS_PATH},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        line = self.process.stdout.readline()  # the "listening" line, printed once ready
        if not line:
            raise RuntimeError(f"fake upstream exited with {self.process.wait()}")
        self.url = json.loads(line)["url"]
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def url_for(self, stream_id: str, hostile: Iterable[str] = ()) -> str:
        return stream_url(self.url, stream_id, hostile)

    def stats(self) -> dict[str, Any]:
        http_url = self.url.replace("ws://", "http://", 1)
        with urllib.request.urlopen(f"{http_url}/stats", timeout=5) as response:
            return json.load(response)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

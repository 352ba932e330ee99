"""Real local servers on loopback: moto in server mode, dynalite, and the simulations' store.

Each is a separate process on a port it binds itself (port 0) and reports, reached only through
the standard endpoint variables, exactly as the code would reach AWS. Tests, the local mode and
the benchmarks start them here.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streamfleet_dev import lifeline

# Credentials and region for local servers: they accept any, but botocore insists on some.
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
# The test suite marks every process it starts with this variable (its run's token), so that
# what is left at its end can be found; the local launchers pass it through.
TEST_RUN_VARIABLE = "STREAMFLEET_TEST_RUN"
# Local mode marks what it starts the same way, so that its reaper finds what is left however
# local mode ended (see reaper.py).
LOCAL_RUN_VARIABLE = "STREAMFLEET_LOCAL_RUN"
RUN_MARKS = (TEST_RUN_VARIABLE, LOCAL_RUN_VARIABLE)
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 5.0
REPO_ROOT = Path(__file__).resolve().parents[3]


# free_port's range: above the well-known and common service ports, below the ephemeral ones.
FIXED_PORTS_FROM = 20000
EPHEMERAL_LOW_DEFAULT = 32768
# What moto (werkzeug) and tools/dynalite-server.js print once they listen.
LISTENING = re.compile(r"(?:running on|listening at:?) http://[^:/\s]+:(\d+)", re.IGNORECASE)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a process that cannot bind
    port 0 itself and report it (a worker's health endpoint). It lies below the kernel's
    ephemeral range, so no port-0 bind elsewhere (the servers here bind so) can take it between
    this probe and the process's own bind."""
    low = EPHEMERAL_LOW_DEFAULT
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(FIXED_PORTS_FROM, max(FIXED_PORTS_FROM + 1, low))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def dynalite_command() -> list[str]:
    """How to run dynalite: ``DYNALITE_BIN``, or ``tools/dynalite-server.js`` (dynalite from
    ``node_modules``, wrapped so that a client killed mid-request does not crash the server)."""
    if os.environ.get("DYNALITE_BIN"):
        return [os.environ["DYNALITE_BIN"]]
    script = REPO_ROOT / "tools" / "dynalite-server.js"
    if not (REPO_ROOT / "node_modules" / "dynalite").exists():
        raise FileNotFoundError("node_modules/dynalite not found (run `npm ci` or `make setup`)")
    return ["node", str(script)]


@dataclass
class LocalServer:
    """One server process on 127.0.0.1. ``endpoint`` is what ``AWS_ENDPOINT_URL*`` should say."""

    kind: str
    command: list[str]
    port: int = 0  # 0 until the first start: the server binds a port and reports it
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _temporary_log: bool = field(default=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalServer:
        """Start the process and wait until it answers HTTP. The first start binds port 0 and
        reads the port the server reports; a restart (an outage) binds the same port again."""
        if self.log_path is None:  # the reported port is read from the log: a temporary one
            descriptor, name = tempfile.mkstemp(prefix=f"streamfleet-{self.kind}-", suffix=".log")
            os.close(descriptor)
            self.log_path, self._temporary_log = Path(name), True
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = lifeline.popen(
                [*self.command, *self._port_args()],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches our code, not the server
            )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.process.returncode} at start")
            if not self.port:
                self.port = self._reported_port(offset)
            if self.port and self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.kind} did not answer on {self.endpoint}")

    def _reported_port(self, offset: int) -> int:
        """The port in the server's own line since ``offset`` of its log (0 while not yet)."""
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            match = LISTENING.search(log.read().decode(errors="replace"))
        return int(match.group(1)) if match else 0

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._temporary_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._temporary_log = None, False

    def _port_args(self) -> list[str]:
        if self.kind == "moto":
            return ["-H", "127.0.0.1", "-p", str(self.port)]
        return ["--host", "127.0.0.1", "--port", str(self.port)]

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=0.5).close()
        except urllib.error.HTTPError:
            return True  # any HTTP answer means it is serving
        except OSError:
            return False
        return True


def moto_server(log_path: Path | None = None) -> LocalServer:
    """moto in server mode: DynamoDB, SQS, CloudWatch and more in one process."""
    return LocalServer("moto", [sys.executable, "-m", "moto.server"], log_path=log_path)


def dynalite_server(log_path: Path | None = None, data_dir: Path | None = None) -> LocalServer:
    """dynalite: an independent DynamoDB implementation; in memory, or in LevelDB files under
    ``data_dir`` so that a stop and a start (an outage) keep the data."""
    command = dynalite_command() + (["--path", str(data_dir)] if data_dir else [])
    return LocalServer("dynalite", command, log_path=log_path)


def sim_dynamodb_server(log_path: Path | None = None) -> LocalServer:
    """The simulations' in-process DynamoDB behind the wire protocol
    (:mod:`streamfleet_dev.dsim.dynamodb_server`): held to the same conformance tests."""
    command = [sys.executable, "-m", "streamfleet_dev.dsim.dynamodb_server"]
    return LocalServer("sim", command, log_path=log_path)


@contextlib.contextmanager
def fleet_servers(log_dir: Path) -> Iterator[tuple[LocalServer, LocalServer]]:
    """dynalite (DynamoDB) and moto (SQS) on loopback, logging under ``log_dir``, with the
    environment pointing at them (and the local credentials) until the block ends."""
    dynamodb = dynalite_server(log_dir / "dynalite.log").start()
    sqs = moto_server(log_dir / "moto.log").start()
    names = (*LOCAL_AWS_ENV, "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(LOCAL_AWS_ENV)
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb.endpoint
    os.environ["AWS_ENDPOINT_URL_SQS"] = sqs.endpoint
    try:
        yield dynamodb, sqs
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        dynamodb.stop()
        sqs.stop()

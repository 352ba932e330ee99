"""``make local`` as a person uses it: start it, watch a stream's owner, kill -9 that worker by
typing ``k N``, see the stream come back on another worker, then Ctrl-C for a clean shutdown."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from streamfleet import model
from streamfleet.lease.dynamo import from_item
from streamfleet_dev.local.fleet import eventually

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TOOLS_PATH = os.pathsep.join(str(REPO / d) for d in ("runtime", "devtools"))


def owners(table: str) -> dict[str, str | None]:
    client = boto3.client("dynamodb")
    items = [from_item(raw) for raw in client.scan(TableName=table)["Items"]]
    return {
        model.connection_id_of(item[model.PK]): item.get(model.LEASE_OWNER)
        for item in items
        if item[model.PK].startswith(model.CONNECTION_PREFIX)
    }


def launch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamfleet_dev.local.mode", *args],
        env={
            **os.environ,
            "PYTHONPATH": f"{REPO / 'runtime'}:{REPO / 'devtools'}",
            "COLUMNS": "120",
        },
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def test_local_mode_recovers_from_a_kill_typed_at_its_prompt(monkeypatch):
    process = launch("--workers", "2", "--streams", "4")
    banner = ""
    try:
        while "QUEUE_URL=" not in banner:
            line = await asyncio.to_thread(process.stdout.readline)
            assert line, f"local mode exited early:\n{banner}"
            banner += line
        exports = dict(re.findall(r"export (\w+)=(\S+)", banner))
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        # Keep reading the live view so the pipe never fills up.
        drain = asyncio.create_task(asyncio.to_thread(process.stdout.read))
        table = exports["TABLE_NAME"]

        live = await eventually(
            lambda: (o := owners(table)) and len(o) == 4 and all(o.values()) and o,
            timeout=30,
            what="all four streams owned",
        )
        victim = live["s00"]
        process.stdin.write(f"k {victim.removeprefix('w')}\n")
        process.stdin.flush()

        await eventually(
            lambda: (o := owners(table)) and o["s00"] not in (None, victim),
            timeout=20,
            what=f"s00 taken over from the killed {victim}",
        )
        process.send_signal(signal.SIGINT)  # Ctrl-C
        assert await asyncio.to_thread(process.wait, 60) == 0
        output = await drain
        assert "shutting down" in output
        assert "kill -9 " + victim in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_help_lists_every_command():
    result = subprocess.run(
        [sys.executable, "-m", "streamfleet_dev.local.mode", "--help"],
        env={**os.environ, "PYTHONPATH": TOOLS_PATH},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--workers" in result.stdout and "--dynamodb" in result.stdout

"""A minimal HTTP health endpoint for the container health check (``GET /health``).

It answers 200 while the worker's loops are running, with what it holds; 503 once one of its
loops has died. A DynamoDB outage alone is *not* unhealthy: replacing every task during an
outage would only add churn, and the holder's promise already closes connections in time.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fleet import Worker

MAX_REQUEST_BYTES = 8192


def health_report(worker: Worker) -> tuple[int, dict]:
    """The status code and body the endpoint would answer now."""
    dead = worker.dead_loops()
    session = worker.store.session
    body = {
        "worker": worker.config.worker_id,
        "connections": len(worker.connections),
        "session_live": not session.deadline_passed(),
        "session_version": session.version,
        "dead_loops": dead,
    }
    return (503 if dead else 200), body


async def serve_health(worker: Worker, port: int) -> None:
    """Serve until cancelled."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(2.0):
                request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            status, body = health_report(worker) if path == b"/health" else (404, {})
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "0.0.0.0", port, limit=MAX_REQUEST_BYTES)
    # Port 0 binds whatever port is free: the log says which (tests read it; never chosen first
    # and bound later, when another process may have taken it).
    worker.log("health_listening", port=server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()

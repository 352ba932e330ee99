"""A minimal HTTP health endpoint for the container health check (``GET /health``).

It answers 200 while the worker's loops are running, with what it holds; 503 once one of its
loops has died. A DynamoDB outage alone is *not* unhealthy: replacing every task during an
outage would only add churn, and the holder's promise already closes connections in time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

MAX_REQUEST_BYTES = 8192

# The status code and body to answer now (the worker's :meth:`~.fleet.Worker.health_report`).
HealthReport = Callable[[], tuple[int, dict[str, Any]]]


async def serve_health(
    report: HealthReport, port: int, on_listening: Callable[[int], None] = lambda port: None
) -> None:
    """Serve ``GET /health`` with ``report`` on ``port`` until cancelled; ``on_listening`` is
    told the port bound (port 0 binds any free one)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(2.0):
                request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            status, body = report() if path == b"/health" else (404, {})
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
    on_listening(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()

"""The probe: one WebSocket to the Region's endpoint, a heartbeat, and the ``pong`` expected
back in time; anything else is a failed probe."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ... import model
from ..handshake import Endpoint


@dataclass(frozen=True)
class ProbeResult:
    """One probe: healthy iff a pong came back in time."""

    healthy: bool
    latency_seconds: float
    error: str | None = None
    refused_status: int | None = None  # the HTTP status of a handshake the Region refused

    @property
    def credentials_refused(self) -> bool:
        """The handshake was refused as unauthenticated (401) or denied (403): what the
        authorizer answers to a token signed with a key it no longer accepts."""
        return self.refused_status in (401, 403)


async def probe(
    endpoint: Endpoint, *, timeout: float, connect_host: str | None = None
) -> ProbeResult:
    """Connect, send a heartbeat, wait for the pong; all within ``timeout`` seconds.

    ``connect_host``: open the connection to this host instead of the URL's, which still names
    the TLS server (SNI, certificate) and the HTTP ``Host``: a custom domain probed in one
    Region, whatever its name resolves to.

    Closing the connection afterwards is not part of the verdict: a pong that arrived in time
    is a healthy probe even if the close handshake is slow.
    """
    started = time.monotonic()

    def result(
        healthy: bool, error: str | None = None, refused_status: int | None = None
    ) -> ProbeResult:
        return ProbeResult(healthy, time.monotonic() - started, error, refused_status)

    url, subprotocols = endpoint.handshake()
    ws = None
    try:
        async with asyncio.timeout(timeout):
            ws = await connect(
                url,
                **({"host": connect_host} if connect_host else {}),
                subprotocols=subprotocols,
                open_timeout=None,  # the overall timeout bounds it
                ping_interval=None,
                close_timeout=max(0.05, timeout / 4),
                compression=None,
                proxy=None,
            )
            await ws.send(json.dumps({"action": model.WS_ROUTE_HEARTBEAT}))
            async for raw in ws:
                # Exactly the text frame "pong"; API Gateway's error frame does not count.
                if raw == model.WS_PONG_FRAME:
                    return result(True)
            return result(False, error="connection closed before the pong")
    except TimeoutError:
        return result(False, error=f"no pong within {timeout:g} s")
    except InvalidStatus as exc:
        status = exc.response.status_code
        return result(False, error=f"handshake refused with HTTP {status}", refused_status=status)
    except ConnectionClosed as exc:
        return result(False, error=f"connection closed: {exc}")
    except Exception as exc:  # refused, DNS, TLS...
        return result(False, error=f"{type(exc).__name__}: {exc}")
    finally:
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()

"""Bounded waits that never lose a cancellation.

On Python 3.11 (the worker's image), ``asyncio.wait_for`` swallows a cancellation of its caller
that arrives as the awaited thing completes: the caller runs on as if never cancelled. A
connection told to end would keep streaming. ``asyncio.timeout`` has no such race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def wait_at_most(awaitable: Awaitable[object], seconds: float) -> bool:
    """Await ``awaitable`` for at most ``seconds``; ``True`` if it finished in time."""
    try:
        async with asyncio.timeout(seconds):
            await awaitable
    except TimeoutError:
        return False
    return True

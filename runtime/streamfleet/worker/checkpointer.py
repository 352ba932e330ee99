"""Recording how far each connection has stored, apart from storing it: a checkpoint is a fenced
write to the lease row, so one per interval per connection bounds what a successor replays
without writing the row once per batch."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from ..lease import SessionLost, StoreUnavailable
from .config import WorkerConfig
from .connection import Connection
from .holdings import Holdings

CHECKPOINT_PARALLELISM = 32


@dataclass(eq=False)
class Checkpointer:
    """Every ``checkpoint_every``, checkpoints the connections that stored more since."""

    config: WorkerConfig
    holdings: Holdings

    async def run(self) -> None:
        limit = asyncio.Semaphore(CHECKPOINT_PARALLELISM)

        async def checkpoint(connection: Connection) -> None:
            async with limit:
                with contextlib.suppress(SessionLost, StoreUnavailable):
                    await connection.checkpoint()

        connections = self.holdings.connections
        while True:
            await asyncio.sleep(self.config.checkpoint_every)
            due = [c for c in connections.values() if c.stored_seq > c.checkpointed_seq]
            await asyncio.gather(*(checkpoint(c) for c in due))

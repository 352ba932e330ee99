"""What this worker holds and what the rest of the fleet reports holding.

Every loop reads or changes it: intake, reconcile and the audit may find the same key at once,
the heartbeat ends everything when the session lapses, rebalance sheds what reconcile must not
take straight back. One object for it, owned by the coordinator and lent to each loop, keeps
them from disagreeing about it.
"""

from __future__ import annotations

import asyncio

from ..lease import SessionInfo
from .connection import Connection, EndReason


class Holdings:
    """This worker's connections, the keys it is busy with, and the fleet as last listed."""

    def __init__(self, max_connections: int):
        self.max_connections = max_connections
        self.connections: dict[str, Connection] = {}
        # The fleet's sessions (their reported loads) as reconcile last listed them.
        self.fleet: list[SessionInfo] = []
        # Keys being claimed or audited right now: claim and audit of one key never overlap
        # (an audit that gives a row back while intake adopts it would leave two clients).
        self.busy: set[str] = set()
        # Keys handed off by rebalancing, and when: not taken straight back.
        self.recently_shed: dict[str, float] = {}
        self.capacity_freed = asyncio.Event()
        self.stopping = asyncio.Event()
        self.draining = False  # an operator asked this worker to hold nothing

    def free_slots(self) -> int:
        if self.draining:
            return 0
        return self.max_connections - len(self.connections) - len(self.busy)

    def end_all(self, reason: EndReason) -> None:
        for connection in list(self.connections.values()):
            connection.end(reason)

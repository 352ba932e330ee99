"""The lease store: sessions with fencing tokens on DynamoDB (docs/lease-model.md).

Small classes with one job each, wired together by :class:`LeaseStore`:

* :class:`SessionKeeper` renews this worker's session and knows the holder's deadline;
* :class:`SessionDirectory` reads, fences and forgets the fleet's sessions;
* :class:`ConnectionLeases` acquires, checkpoints and releases connections (fenced);
* :class:`OrphanFinder` finds claimable connections at O(workers + orphans).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import model
from ..aws import AsyncClient
from ..clock import SYSTEM_CLOCK, Clock
from .connections import Claimable, ConnectionLeases, Lease
from .errors import LeaseError, LeaseLost, SessionLost, StoreUnavailable
from .orphans import OrphanFinder
from .sessions import SessionDirectory, SessionInfo, SessionKeeper
from .timing import LeaseTiming

__all__ = [
    "Claimable",
    "ConnectionLeases",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "LeaseTiming",
    "OrphanFinder",
    "SessionDirectory",
    "SessionInfo",
    "SessionKeeper",
    "SessionLost",
    "StoreUnavailable",
]


@dataclass(frozen=True)
class LeaseStore:
    """Everything one worker needs from the lease table, sharing one session."""

    session: SessionKeeper
    directory: SessionDirectory
    connections: ConnectionLeases
    orphans: OrphanFinder

    @classmethod
    def create(
        cls,
        *,
        table_name: str,
        worker_id: str,
        timing: LeaseTiming,
        dynamodb: AsyncClient,
        renewals: AsyncClient | None = None,
        clock: Clock = SYSTEM_CLOCK,
        group: str = model.DEFAULT_SESSION_GROUP,
        region: str = "",
        capacity: int = 0,
        task_arn: str = "",
    ) -> LeaseStore:
        """Wire the parts. ``renewals``: a client of its own for session renewals, so they never
        wait behind other calls in a busy pool (defaults to ``dynamodb``)."""
        session = SessionKeeper(
            dynamodb=renewals or dynamodb,
            table_name=table_name,
            worker_id=worker_id,
            timing=timing,
            clock=clock,
            group=group,
            region=region,
            capacity=capacity,
            task_arn=task_arn,
        )
        directory = SessionDirectory(
            dynamodb=dynamodb, table_name=table_name, timing=timing, clock=clock, group=group
        )
        connections = ConnectionLeases(
            dynamodb=dynamodb, table_name=table_name, session=session, directory=directory
        )
        return cls(
            session=session,
            directory=directory,
            connections=connections,
            orphans=OrphanFinder(
                dynamodb=dynamodb,
                table_name=table_name,
                directory=directory,
                known_held=connections.known_held,
            ),
        )

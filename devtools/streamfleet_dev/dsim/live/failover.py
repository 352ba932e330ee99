"""A regional failover in a schedule: the primary fails, the failover name moves its clients to
the secondary, and in some schedules the primary recovers and the name moves back.

As deployed (docs/websocket-api.md, docs/disaster-recovery.md), compressed in time: the
primary's canary fails its runs, its alarm (2 of 2 datapoints) trips, the health check marks
the PRIMARY record unhealthy and the name answers with the SECONDARY; the tripped canary closes
every connection of the primary, and clients reconnect through the name with full-jitter
backoff, subscribing every stream from their cursor's position. A Region that recovers gets
the name back after its canary's healthy runs; clients already on the secondary stay there
until they reconnect.

Two ways to fail:

* ``api``: the primary's WebSocket API (its handlers throttled): no handshake, no message
  routed; its fleet, tables, fan-out (which posts to the connections still open) and
  replication go on;
* ``region``: the primary cut off from the outside: the same, and its clients' sockets are
  dead at once (each client notices by its heartbeats before the name moves), and nothing it
  stores replicates until it recovers (its fleet goes on storing inside it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.aws import Connection, Gateway
    from streamfleet_dev.dsim.live.world import World

SHARE = 0.2  # of schedules with a failover
KINDS = ("api", "region")


@dataclass(frozen=True)
class Failover:
    at: float  # the primary fails
    kind: str  # one of KINDS
    detected_after: float  # until its alarm trips: the name moves, the canary sweeps
    recovers_at: float | None  # the primary works again (None: not in this run)
    failback_after: float  # the canary's healthy runs before the name moves back
    lag_max: float  # each replicated write's lag is drawn from 0 to this
    # Clients that dial the secondary's regional URL, not the failover name (as half the
    # drill's do): served by its replica and fan-out all along, through the primary's failure.
    pinned: tuple[str, ...] = ()

    @classmethod
    def draw(cls, seed: int, duration: float, users: tuple[str, ...]) -> Failover | None:
        """One schedule in five has a failover while its faults last (drawn apart from the
        schedule's other draws, which stay as they were)."""
        rng = random.Random(f"failover-{seed}")
        if rng.random() >= SHARE:
            return None
        at = rng.uniform(2.0, duration - 2.0)
        detected_after = rng.uniform(0.5, 4.0)
        recovers_at = None
        if rng.random() < 0.6:
            recovers_at = at + detected_after + rng.uniform(1.0, 20.0)
        return cls(
            at=at,
            kind=rng.choice(KINDS),
            detected_after=detected_after,
            recovers_at=recovers_at,
            failback_after=rng.uniform(1.0, 5.0),
            lag_max=rng.choice((0.05, 0.5, 2.0)),
            pinned=tuple(user for user in users if rng.random() < 0.25),
        )

    def on_secondary(self, now: float) -> bool:
        """Whether the failover name answers with the secondary at ``now``."""
        moved = self.at + self.detected_after
        if now < moved:
            return False
        return self.recovers_at is None or now < self.recovers_at + self.failback_after

    def describe(self) -> str:
        back = (
            f"recovers at {self.recovers_at:.1f} s, the name back {self.failback_after:.1f} s later"
            if self.recovers_at is not None
            else "does not recover"
        )
        return (
            f"failover: the primary's {self.kind} fails at {self.at:.1f} s, detected "
            f"{self.detected_after:.1f} s later, {back}; replication lag <= {self.lag_max:g} s"
            + (f"; pinned to the secondary: {','.join(self.pinned)}" if self.pinned else "")
        )


def run_failover(world: World) -> None:
    """The primary fails, the name moves (the tripped canary closes its connections), and the
    primary may recover, the name moving back after it."""
    failover, scheduler = world.schedule.failover, world.scheduler
    assert failover is not None and world.replication is not None
    primary, gateway = world.primary, world.primary.gateway
    scheduler.sleep(failover.at)
    primary.api_up = False
    world.note(f"the primary's {failover.kind} fails")
    if failover.kind == "region":
        primary.isolated = True
        for connection in _open(gateway):
            # Its client hears nothing more: it leaves after its missed heartbeats.
            gateway.cut_off(connection)
    scheduler.sleep(failover.detected_after)
    world.note("the failover name answers with the secondary")
    for connection in _open(gateway):
        gateway.delete(connection.id, "closed by the tripped canary")
    if failover.recovers_at is None:
        return
    scheduler.sleep(failover.recovers_at - scheduler.now)
    primary.api_up, primary.isolated = True, False
    world.replication.resume()
    for replication in world.state_replication.values():
        replication.resume()
    world.note("the primary recovers")
    scheduler.sleep(failover.failback_after)
    world.note("the failover name answers with the primary again")


def _open(gateway: Gateway) -> list[Connection]:
    """The gateway's connections whose clients are still there, in the order they were made."""
    return [c for c in gateway.connections.values() if c.open and not c.dropped]
